// The verbs entry points tent calls, looked up with dlvsym at Open. Every
// wrapper returns 0 or an errno value (never -1) so that Go can name it.
#ifndef TENT_VERBS_LOADER_H
#define TENT_VERBS_LOADER_H

#include <stdint.h>
#include "abi.h"

typedef struct tv_lib {
	void *handle;
	tv_device **(*get_device_list)(int *num);
	void (*free_device_list)(tv_device **list);
	const char *(*get_device_name)(tv_device *dev);
	uint64_t (*get_device_guid)(tv_device *dev); // big-endian
	tv_context *(*open_device)(tv_device *dev);
	int (*close_device)(tv_context *ctx);
	int (*query_port)(tv_context *ctx, uint8_t port, tv_port_attr *attr);
	int (*query_gid)(tv_context *ctx, uint8_t port, int index, tv_gid *gid);
	tv_pd *(*alloc_pd)(tv_context *ctx);
	int (*dealloc_pd)(tv_pd *pd);
	tv_mr *(*reg_mr)(tv_pd *pd, void *addr, size_t length, int access);
	tv_mr *(*reg_dmabuf_mr)(tv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access); // NULL when absent
	int (*dereg_mr)(tv_mr *mr);
	tv_cq *(*create_cq)(tv_context *ctx, int cqe, void *cq_context, void *channel, int comp_vector);
	int (*destroy_cq)(tv_cq *cq);
	tv_qp *(*create_qp)(tv_pd *pd, tv_qp_init_attr *attr);
	int (*modify_qp)(tv_qp *qp, tv_qp_attr *attr, int mask);
	int (*destroy_qp)(tv_qp *qp);
} tv_lib;

// One work request as Go hands it over (no pointers inside).
typedef struct tv_flat_wr {
	uint64_t id;
	uint64_t local_addr;
	uint64_t remote_addr;
	uint32_t length;
	uint32_t lkey;
	uint32_t rkey;
	int32_t opcode;
	int32_t signaled;
} tv_flat_wr;

// The attributes read from a device list entry.
typedef struct tv_device_info {
	char name[64];
	char ibdev_path[256];
	uint64_t guid; // host order
} tv_device_info;

const char *tv_open(const char *path, tv_lib *lib);
void tv_close(tv_lib *lib);
int tv_list_devices(tv_lib *lib, tv_device_info *out, int max, int *n);
int tv_open_device(tv_lib *lib, const char *name, tv_context **ctx);
int tv_close_device(tv_lib *lib, tv_context *ctx);
int tv_query_port(tv_lib *lib, tv_context *ctx, uint8_t port, tv_port_attr *attr);
int tv_query_gid(tv_lib *lib, tv_context *ctx, uint8_t port, int index, tv_gid *gid);
int tv_alloc_pd(tv_lib *lib, tv_context *ctx, tv_pd **pd);
int tv_dealloc_pd(tv_lib *lib, tv_pd *pd);
int tv_reg_mr(tv_lib *lib, tv_pd *pd, uintptr_t addr, uint64_t length, int access, tv_mr **mr);
int tv_reg_dmabuf_mr(tv_lib *lib, tv_pd *pd, uint64_t offset, uint64_t length, uint64_t iova, int fd, int access, tv_mr **mr);
int tv_dereg_mr(tv_lib *lib, tv_mr *mr);
int tv_create_cq(tv_lib *lib, tv_context *ctx, int entries, tv_cq **cq);
int tv_destroy_cq(tv_lib *lib, tv_cq *cq);
int tv_create_rc_qp(tv_lib *lib, tv_pd *pd, tv_cq *send, tv_cq *recv, tv_qp_cap *cap, tv_qp **qp);
int tv_modify_qp(tv_lib *lib, tv_qp *qp, tv_qp_attr *attr, int mask);
int tv_destroy_qp(tv_lib *lib, tv_qp *qp);
// Chains n work requests in buf (room for n tv_send_wr and n tv_sge) and
// posts them with one ibv_post_send; *bad is the index of the refused one.
int tv_post_send(tv_qp *qp, const tv_flat_wr *wrs, int n, void *buf, int *bad);
// Returns the number of completions (>= 0) or a negative value on error.
int tv_poll_cq(tv_cq *cq, int n, tv_wc *out);

#endif
