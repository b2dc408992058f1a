package gpuaccess

import cu "github.com/tent-dev/tent/cuda"

// Accessor implements peertest.Accessor with host<->device copies.
type Accessor struct{}

// Read copies n bytes of device memory at addr to the host.
func (Accessor) Read(addr, n uint64) ([]byte, error) {
	d, err := cu.Default()
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	return b, d.CopyDtoH(b, addr)
}

// Write copies b to device memory at addr.
func (Accessor) Write(addr uint64, b []byte) error {
	d, err := cu.Default()
	if err != nil {
		return err
	}
	return d.CopyHtoD(addr, b)
}
