#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <endian.h>
#include <string.h>
#include "loader.h"

// The version every entry point below has had since rdma-core replaced the
// IBVERBS_1.0 compatibility layer; ibv_reg_dmabuf_mr came with 1.12.
#define VERBS_V "IBVERBS_1.1"

static void *sym(void *h, const char *name, const char *version) {
	return dlvsym(h, name, version);
}

const char *tv_open(const char *path, tv_lib *lib) {
	memset(lib, 0, sizeof *lib);
	dlerror();
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		return e ? e : "dlopen failed";
	}
	lib->handle = h;
#define NEED(field, name) \
	if ((*(void **)&lib->field = sym(h, name, VERBS_V)) == NULL) { \
		dlclose(h); \
		memset(lib, 0, sizeof *lib); \
		return "the library lacks " name "@" VERBS_V; \
	}
	NEED(get_device_list, "ibv_get_device_list");
	NEED(free_device_list, "ibv_free_device_list");
	NEED(get_device_name, "ibv_get_device_name");
	NEED(get_device_guid, "ibv_get_device_guid");
	NEED(open_device, "ibv_open_device");
	NEED(close_device, "ibv_close_device");
	NEED(query_port, "ibv_query_port");
	NEED(query_gid, "ibv_query_gid");
	NEED(alloc_pd, "ibv_alloc_pd");
	NEED(dealloc_pd, "ibv_dealloc_pd");
	NEED(reg_mr, "ibv_reg_mr");
	NEED(dereg_mr, "ibv_dereg_mr");
	NEED(create_cq, "ibv_create_cq");
	NEED(destroy_cq, "ibv_destroy_cq");
	NEED(create_qp, "ibv_create_qp");
	NEED(modify_qp, "ibv_modify_qp");
	NEED(destroy_qp, "ibv_destroy_qp");
#undef NEED
	*(void **)&lib->reg_dmabuf_mr = sym(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
	return NULL;
}

void tv_close(tv_lib *lib) {
	if (lib->handle) dlclose(lib->handle);
	memset(lib, 0, sizeof *lib);
}

// errno after a failed call, never 0 (a library that forgot to set it).
static int failed(void) { return errno ? errno : EIO; }

// verbs calls that return an int return 0, an errno value or (some
// providers) -1 with errno set.
static int status(int rc) {
	if (rc == 0) return 0;
	if (rc < 0) return failed();
	return rc;
}

int tv_list_devices(tv_lib *lib, tv_device_info *out, int max, int *n) {
	*n = 0;
	int num = 0;
	errno = 0;
	tv_device **list = lib->get_device_list(&num);
	if (list == NULL) return failed();
	for (int i = 0; i < num && list[i] != NULL; i++) {
		if (*n < max) {
			tv_device_info *d = &out[*n];
			const char *name = lib->get_device_name(list[i]);
			strncpy(d->name, name ? name : "", sizeof d->name - 1);
			strncpy(d->ibdev_path, list[i]->ibdev_path, sizeof d->ibdev_path - 1);
			d->guid = be64toh(lib->get_device_guid(list[i]));
		}
		(*n)++;
	}
	lib->free_device_list(list);
	return 0;
}

int tv_open_device(tv_lib *lib, const char *name, tv_context **ctx) {
	*ctx = NULL;
	int num = 0;
	errno = 0;
	tv_device **list = lib->get_device_list(&num);
	if (list == NULL) return failed();
	int rc = ENODEV;
	for (int i = 0; i < num && list[i] != NULL; i++) {
		const char *n = lib->get_device_name(list[i]);
		if (n == NULL || strcmp(n, name) != 0) continue;
		errno = 0;
		*ctx = lib->open_device(list[i]);
		rc = *ctx ? 0 : failed();
		break;
	}
	// A context keeps its device alive after the list is freed.
	lib->free_device_list(list);
	return rc;
}

int tv_close_device(tv_lib *lib, tv_context *ctx) { errno = 0; return status(lib->close_device(ctx)); }

int tv_query_port(tv_lib *lib, tv_context *ctx, uint8_t port, tv_port_attr *attr) {
	// Room for the fields newer libraries append.
	union { tv_port_attr attr; char room[256]; } buf;
	memset(&buf, 0, sizeof buf);
	errno = 0;
	int rc = status(lib->query_port(ctx, port, &buf.attr));
	if (rc == 0) *attr = buf.attr;
	return rc;
}

int tv_query_gid(tv_lib *lib, tv_context *ctx, uint8_t port, int index, tv_gid *gid) {
	errno = 0;
	return status(lib->query_gid(ctx, port, index, gid));
}

int tv_alloc_pd(tv_lib *lib, tv_context *ctx, tv_pd **pd) {
	errno = 0;
	*pd = lib->alloc_pd(ctx);
	return *pd ? 0 : failed();
}

int tv_dealloc_pd(tv_lib *lib, tv_pd *pd) { errno = 0; return status(lib->dealloc_pd(pd)); }

int tv_reg_mr(tv_lib *lib, tv_pd *pd, uintptr_t addr, uint64_t length, int access, tv_mr **mr) {
	errno = 0;
	*mr = lib->reg_mr(pd, (void *)addr, (size_t)length, access);
	return *mr ? 0 : failed();
}

int tv_reg_dmabuf_mr(tv_lib *lib, tv_pd *pd, uint64_t offset, uint64_t length, uint64_t iova, int fd, int access, tv_mr **mr) {
	*mr = NULL;
	if (lib->reg_dmabuf_mr == NULL) return EOPNOTSUPP;
	errno = 0;
	*mr = lib->reg_dmabuf_mr(pd, offset, (size_t)length, iova, fd, access);
	return *mr ? 0 : failed();
}

int tv_dereg_mr(tv_lib *lib, tv_mr *mr) { errno = 0; return status(lib->dereg_mr(mr)); }

int tv_create_cq(tv_lib *lib, tv_context *ctx, int entries, tv_cq **cq) {
	errno = 0;
	*cq = lib->create_cq(ctx, entries, NULL, NULL, 0);
	return *cq ? 0 : failed();
}

int tv_destroy_cq(tv_lib *lib, tv_cq *cq) { errno = 0; return status(lib->destroy_cq(cq)); }

int tv_create_rc_qp(tv_lib *lib, tv_pd *pd, tv_cq *send, tv_cq *recv, tv_qp_cap *cap, tv_qp **qp) {
	tv_qp_init_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.send_cq = send;
	attr.recv_cq = recv;
	attr.cap = *cap;
	attr.qp_type = TV_QPT_RC;
	errno = 0;
	*qp = lib->create_qp(pd, &attr);
	if (*qp == NULL) return failed();
	*cap = attr.cap; // the provider writes back what it granted
	return 0;
}

int tv_modify_qp(tv_lib *lib, tv_qp *qp, tv_qp_attr *attr, int mask) {
	errno = 0;
	return status(lib->modify_qp(qp, attr, mask));
}

int tv_destroy_qp(tv_lib *lib, tv_qp *qp) { errno = 0; return status(lib->destroy_qp(qp)); }

int tv_post_send(tv_qp *qp, const tv_flat_wr *wrs, int n, void *buf, int *bad) {
	*bad = -1;
	if (n <= 0) return 0;
	tv_send_wr *chain = buf;
	tv_sge *sges = (tv_sge *)(chain + n);
	memset(chain, 0, sizeof *chain * (size_t)n);
	for (int i = 0; i < n; i++) {
		sges[i].addr = wrs[i].local_addr;
		sges[i].length = wrs[i].length;
		sges[i].lkey = wrs[i].lkey;
		chain[i].wr_id = wrs[i].id;
		chain[i].next = i + 1 < n ? &chain[i + 1] : NULL;
		chain[i].sg_list = &sges[i];
		chain[i].num_sge = 1;
		chain[i].opcode = wrs[i].opcode;
		chain[i].send_flags = wrs[i].signaled ? TV_SEND_SIGNALED : 0;
		chain[i].remote_addr = wrs[i].remote_addr;
		chain[i].rkey = wrs[i].rkey;
	}
	tv_send_wr *bad_wr = NULL;
	errno = 0;
	int rc = status(qp->context->ops.post_send(qp, chain, &bad_wr));
	if (rc != 0) *bad = bad_wr ? (int)(bad_wr - chain) : 0;
	return rc;
}

int tv_poll_cq(tv_cq *cq, int n, tv_wc *out) {
	return cq->context->ops.poll_cq(cq, n, out);
}
