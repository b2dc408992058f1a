typedef struct {
	void *handle;
	void *get_device_list;
	void *free_device_list;
	void *get_device_name;
} tent_verbs_lib;
const char *tent_verbs_open(const char *path, tent_verbs_lib *lib);
void tent_verbs_close(tent_verbs_lib *lib);
void *tent_verbs_list(tent_verbs_lib *lib, int *n);
const char *tent_verbs_name(tent_verbs_lib *lib, void *list, int i);
void tent_verbs_free_list(tent_verbs_lib *lib, void *list);
