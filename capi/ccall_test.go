package main

import (
	"runtime"

	"github.com/tent-dev/tent/capi/internal/capitest"
	"github.com/tent-dev/tent/core"
)

// The tests call the public C functions through capitest, which wraps them
// in cgo (a _test.go file cannot use cgo), under the short names below.
type (
	result     = capitest.Result
	cOptions   = capitest.Options
	regionInfo = capitest.RegionInfo
	cColumns   = capitest.Columns
)

const sizeofOptions = capitest.SizeofOptions

var (
	strp                  = capitest.Strp
	cMalloc               = capitest.Malloc
	cEngineCreate         = capitest.EngineCreate
	cEngineCreateOut      = capitest.EngineCreateOut
	cEngineCreateRaw      = capitest.EngineCreateRaw
	cEngineCreateWithTail = capitest.EngineCreateWithTail
	cEngineDestroy        = capitest.EngineDestroy
	cEngineName           = capitest.EngineName
	cEngineTransports     = capitest.EngineTransports
	cRegister             = capitest.Register
	cRegisterRaw          = capitest.RegisterRaw
	cRegisterRawLoc       = capitest.RegisterRawLoc
	cRegisterBatch        = capitest.RegisterBatch
	cRegisterBatchOut     = capitest.RegisterBatchOut
	cRegisterBatchRaw     = capitest.RegisterBatchRaw
	cUnregister           = capitest.Unregister
	cUnregisterBatch      = capitest.UnregisterBatch
	cUnregisterBatchRaw   = capitest.UnregisterBatchRaw
	cRegionInfo           = capitest.RegionGetInfo
	cAllocRaw             = capitest.AllocRaw
	cUninstall            = capitest.Uninstall
	cStats                = capitest.EngineStats
	cStatsJSON            = capitest.StatsJSON
	cTopologyJSON         = capitest.TopologyJSON
	cStatusStr            = capitest.StatusStr
	cTransportName        = capitest.TransportName
	cVersion              = capitest.Version
	cSegmentOpen          = capitest.SegmentOpen
	cSegmentClose         = capitest.SegmentClose
	cTransferSyncRaw      = capitest.TransferSyncRaw
	cColumnsRaw           = capitest.TransferColumnsRaw
	cColumnsSyncRaw       = capitest.TransferColumnsSyncRaw
	cBatchWait            = capitest.BatchWait
	cBatchStatusRaw       = capitest.BatchStatusRaw
	cBatchDestroy         = capitest.BatchDestroy
)

// mapOptions runs the Go mapping of o alone (no engine is created).
func mapOptions(o *cOptions) (core.Options, error) {
	if o == nil {
		return engineOptions(0)
	}
	p, free := o.Build()
	defer free()
	return engineOptions(p)
}

// cSetErrorAndRead sets the last error through the Go path and reads it
// back on the same thread.
func cSetErrorAndRead(msg string) string {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	setLastError(msg)
	return capitest.LastError()
}
