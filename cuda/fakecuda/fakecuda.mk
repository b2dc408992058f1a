# Make rules for the fake CUDA driver (see doc.go). Include this file and
# depend on $(FAKECUDA_LIB); Go tests do not need it (fakecuda.New builds the
# library itself).
#
#   include cuda/fakecuda/fakecuda.mk
#   test-gpu-transport: $(FAKECUDA_LIB)
#           TENT_CUDA_DRIVER=$(abspath $(FAKECUDA_LIB)) ./some-test

FAKECUDA_DIR ?= cuda/fakecuda
FAKECUDA_OUT ?= build
FAKECUDA_LIB ?= $(FAKECUDA_OUT)/libfakecuda.so
CC ?= gcc

$(FAKECUDA_LIB): $(FAKECUDA_DIR)/fakecuda.c $(FAKECUDA_DIR)/fakecuda.h
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -O1 -Wall -o $@ $< -lpthread
