//go:build !unix

package slab

import (
	"errors"

	"github.com/tent-dev/tent/status"
)

var errNoMmap = errors.New("mmap is not available on this platform")

func mapChunk(int, int, int64) ([]byte, error) { return nil, errNoMmap }
func unmapChunk([]byte) error                  { return errNoMmap }
func dupFile(int) (int, error)                 { return -1, errNoMmap }
func closeFile(int) error                      { return errNoMmap }
func fileSize(int) (int64, bool, error)        { return 0, false, errNoMmap }

func sysCode(error) status.Code { return status.Unsupported }
