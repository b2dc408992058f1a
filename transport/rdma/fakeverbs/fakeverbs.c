// A fake libibverbs.so.1 for tests on machines without an RDMA NIC. It
// implements only what tent calls. FAKEVERBS_DEVICES sets the number of
// devices (default 2); FAKEVERBS_FAIL=ibv_get_device_list makes that call
// fail. Live device lists are counted (fakeverbs_live_lists).
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

struct fake_device { char name[32]; };

static int live_lists;

int fakeverbs_live_lists(void) { return live_lists; }

void **ibv_get_device_list(int *num) {
	const char *fail = getenv("FAKEVERBS_FAIL");
	if (fail && strcmp(fail, "ibv_get_device_list") == 0) return NULL;
	const char *env = getenv("FAKEVERBS_DEVICES");
	int n = env ? atoi(env) : 2;
	if (n < 0) n = 0;
	void **list = calloc((size_t)n + 1, sizeof(void *));
	if (!list) return NULL;
	for (int i = 0; i < n; i++) {
		struct fake_device *d = calloc(1, sizeof *d);
		snprintf(d->name, sizeof d->name, "fake_%d", i);
		list[i] = d;
	}
	if (num) *num = n;
	live_lists++;
	return list;
}

void ibv_free_device_list(void **list) {
	for (void **p = list; *p; p++) free(*p);
	free(list);
	live_lists--;
}

const char *ibv_get_device_name(void *dev) { return ((struct fake_device *)dev)->name; }
