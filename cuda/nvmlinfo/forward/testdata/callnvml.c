/*
 * Calls the forwarders directly (compiled with forward.c and forward_gen.c
 * by forward_test.go), printing one line per call:
 *   init=<r> count=<r>:<n> power=<r> error_string=<s>
 */
#include <stdio.h>

#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include "nvml.h"

int main(void) {
	nvmlReturn_t init = nvmlInit_v2();
	unsigned int n = 0;
	nvmlReturn_t count = nvmlDeviceGetCount_v2(&n);
	nvmlDevice_t dev = {0}; /* go-nvml's nvml.h wraps the handle in a struct */
	unsigned int mw = 0;
	nvmlReturn_t power = nvmlDeviceGetHandleByIndex_v2(0, &dev);
	if (power == NVML_SUCCESS) power = nvmlDeviceGetPowerUsage(dev, &mw);
	printf("init=%d count=%d:%u power=%d error_string=%s\n", (int)init, (int)count, n, (int)power,
	       nvmlErrorString(NVML_ERROR_FUNCTION_NOT_FOUND));
	return 0;
}
