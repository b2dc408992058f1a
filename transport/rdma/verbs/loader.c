#include <dlfcn.h>
#include <stddef.h>
#include "loader.h"

// struct ibv_device stays opaque: tent asks the library for names instead of
// reading the struct, so no verbs header is needed to build.
typedef void **(*get_device_list_fn)(int *);
typedef void (*free_device_list_fn)(void **);
typedef const char *(*get_device_name_fn)(void *);

const char *tent_verbs_open(const char *path, tent_verbs_lib *lib) {
	dlerror();
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		return e ? e : "dlopen failed";
	}
	lib->handle = h;
	lib->get_device_list = dlsym(h, "ibv_get_device_list");
	lib->free_device_list = dlsym(h, "ibv_free_device_list");
	lib->get_device_name = dlsym(h, "ibv_get_device_name");
	if (!lib->get_device_list || !lib->free_device_list || !lib->get_device_name) {
		dlclose(h);
		lib->handle = NULL;
		return "the library lacks ibv_get_device_list, ibv_free_device_list or ibv_get_device_name";
	}
	return NULL;
}

void tent_verbs_close(tent_verbs_lib *lib) {
	if (lib->handle) dlclose(lib->handle);
	lib->handle = NULL;
}

void *tent_verbs_list(tent_verbs_lib *lib, int *n) {
	*n = 0;
	return ((get_device_list_fn)lib->get_device_list)(n);
}

const char *tent_verbs_name(tent_verbs_lib *lib, void *list, int i) {
	return ((get_device_name_fn)lib->get_device_name)(((void **)list)[i]);
}

void tent_verbs_free_list(tent_verbs_lib *lib, void *list) {
	if (list) ((free_device_list_fn)lib->free_device_list)((void **)list);
}
