// The part of the libibverbs (rdma-core) binary interface tent uses, declared
// here so that nothing needs rdma-core's headers to build. Names carry a tv_
// prefix so that testdata/abi_check.c can include this file next to the real
// <infiniband/verbs.h> and assert, field by field, that sizes and offsets
// agree (TestABIMatchesVerbsHeader). Fields tent never reads are kept only
// as padding of the right size. The fake library (transport/rdma/fakeverbs)
// implements this same interface.
//
// Facts about the interface that shape this file:
//   - ibv_post_send and ibv_poll_cq are inline in verbs.h: they call through
//     the function table embedded in struct ibv_context (ops.post_send,
//     ops.poll_cq), so callers need that table's layout, not a symbol.
//   - The exported functions are versioned; the current ones are
//     IBVERBS_1.1 (ibv_reg_dmabuf_mr: IBVERBS_1.12).
//   - ibv_reg_mr in verbs.h is a macro that calls the exported ibv_reg_mr
//     unless the access flags hold optional-range bits (then
//     ibv_reg_mr_iova2); tent never sets those bits.
//   - ibv_query_port in verbs.h is inline too; when the provider has no
//     extended query it falls back to the exported ibv_query_port with the
//     legacy attribute struct, a prefix of tv_port_attr. tent calls the
//     export with a zeroed tv_port_attr.
#ifndef TENT_VERBS_ABI_H
#define TENT_VERBS_ABI_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum {
	TV_ACCESS_LOCAL_WRITE = 1,
	TV_ACCESS_REMOTE_WRITE = 2,
	TV_ACCESS_REMOTE_READ = 4,
};

enum { TV_QPT_RC = 2 };

enum {
	TV_QPS_RESET = 0,
	TV_QPS_INIT = 1,
	TV_QPS_RTR = 2,
	TV_QPS_RTS = 3,
	TV_QPS_SQD = 4,
	TV_QPS_SQE = 5,
	TV_QPS_ERR = 6,
};

// ibv_qp_attr_mask bits.
enum {
	TV_QP_STATE = 1 << 0,
	TV_QP_ACCESS_FLAGS = 1 << 3,
	TV_QP_PKEY_INDEX = 1 << 4,
	TV_QP_PORT = 1 << 5,
	TV_QP_AV = 1 << 7,
	TV_QP_PATH_MTU = 1 << 8,
	TV_QP_TIMEOUT = 1 << 9,
	TV_QP_RETRY_CNT = 1 << 10,
	TV_QP_RNR_RETRY = 1 << 11,
	TV_QP_RQ_PSN = 1 << 12,
	TV_QP_MAX_QP_RD_ATOMIC = 1 << 13,
	TV_QP_MIN_RNR_TIMER = 1 << 15,
	TV_QP_SQ_PSN = 1 << 16,
	TV_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
	TV_QP_DEST_QPN = 1 << 20,
};

// ibv_wr_opcode and ibv_wc_opcode values tent uses.
enum { TV_WR_RDMA_WRITE = 0, TV_WR_RDMA_READ = 4 };
enum { TV_WC_RDMA_WRITE = 1, TV_WC_RDMA_READ = 2 };
enum { TV_SEND_SIGNALED = 2 };

// ibv_wc_status values the fake produces (the Go side names them all).
enum {
	TV_WC_SUCCESS = 0,
	TV_WC_LOC_PROT_ERR = 4,
	TV_WC_WR_FLUSH_ERR = 5,
	TV_WC_REM_ACCESS_ERR = 10,
	TV_WC_RETRY_EXC_ERR = 12,
	TV_WC_GENERAL_ERR = 21,
};

enum { TV_PORT_ACTIVE = 4 };
enum { TV_MTU_4096 = 5 };
enum { TV_LINK_LAYER_INFINIBAND = 1, TV_LINK_LAYER_ETHERNET = 2 };

typedef union tv_gid {
	uint8_t raw[16];
	uint64_t align_[2]; // the real union holds two 64-bit words
} tv_gid;

typedef struct tv_device {
	void *ops_[2];
	int node_type;
	int transport_type;
	char name[64];
	char dev_name[64];
	char dev_path[256];
	char ibdev_path[256]; // /sys/class/infiniband/<name>
} tv_device;

struct tv_qp;
struct tv_cq;
struct tv_send_wr;
struct tv_wc;

// 32 entry points; tent calls two of them.
typedef struct tv_context_ops {
	void *before_poll_cq_[11];
	int (*poll_cq)(struct tv_cq *cq, int num_entries, struct tv_wc *wc);
	void *before_post_send_[13];
	int (*post_send)(struct tv_qp *qp, struct tv_send_wr *wr, struct tv_send_wr **bad_wr);
	void *after_post_send_[6];
} tv_context_ops;

typedef struct tv_context {
	tv_device *device;
	tv_context_ops ops;
	int cmd_fd;
	int async_fd;
	int num_comp_vectors;
	pthread_mutex_t mutex;
	void *abi_compat;
} tv_context;

typedef struct tv_pd {
	tv_context *context;
	uint32_t handle;
} tv_pd;

typedef struct tv_mr {
	tv_context *context;
	tv_pd *pd;
	void *addr;
	size_t length;
	uint32_t handle;
	uint32_t lkey;
	uint32_t rkey;
} tv_mr;

typedef struct tv_cq {
	tv_context *context;
	void *channel;
	void *cq_context;
	uint32_t handle;
	int cqe;
	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t comp_events_completed;
	uint32_t async_events_completed;
} tv_cq;

typedef struct tv_qp {
	tv_context *context;
	void *qp_context;
	tv_pd *pd;
	tv_cq *send_cq;
	tv_cq *recv_cq;
	void *srq;
	uint32_t handle;
	uint32_t qp_num;
	int state;
	int qp_type;
	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t events_completed;
} tv_qp;

typedef struct tv_qp_cap {
	uint32_t max_send_wr;
	uint32_t max_recv_wr;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
} tv_qp_cap;

typedef struct tv_qp_init_attr {
	void *qp_context;
	tv_cq *send_cq;
	tv_cq *recv_cq;
	void *srq;
	tv_qp_cap cap;
	int qp_type;
	int sq_sig_all;
} tv_qp_init_attr;

typedef struct tv_global_route {
	tv_gid dgid;
	uint32_t flow_label;
	uint8_t sgid_index;
	uint8_t hop_limit;
	uint8_t traffic_class;
} tv_global_route;

typedef struct tv_ah_attr {
	tv_global_route grh;
	uint16_t dlid;
	uint8_t sl;
	uint8_t src_path_bits;
	uint8_t static_rate;
	uint8_t is_global;
	uint8_t port_num;
} tv_ah_attr;

typedef struct tv_qp_attr {
	int qp_state;
	int cur_qp_state;
	int path_mtu;
	int path_mig_state;
	uint32_t qkey;
	uint32_t rq_psn;
	uint32_t sq_psn;
	uint32_t dest_qp_num;
	unsigned int qp_access_flags;
	tv_qp_cap cap;
	tv_ah_attr ah_attr;
	tv_ah_attr alt_ah_attr;
	uint16_t pkey_index;
	uint16_t alt_pkey_index;
	uint8_t en_sqd_async_notify;
	uint8_t sq_draining;
	uint8_t max_rd_atomic;
	uint8_t max_dest_rd_atomic;
	uint8_t min_rnr_timer;
	uint8_t port_num;
	uint8_t timeout;
	uint8_t retry_cnt;
	uint8_t rnr_retry;
	uint8_t alt_port_num;
	uint8_t alt_timeout;
	uint32_t rate_limit;
} tv_qp_attr;

typedef struct tv_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
} tv_sge;

typedef struct tv_send_wr {
	uint64_t wr_id;
	struct tv_send_wr *next;
	tv_sge *sg_list;
	int num_sge;
	int opcode;
	unsigned int send_flags;
	uint32_t imm_data;
	// wr.rdma of the union wr (the union is 32 bytes: wr.atomic's size)
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t wr_rest_[5];
	uint32_t remote_srqn;
	uint32_t pad_;
	uint64_t tail_[6]; // the bind_mw / tso union
} tv_send_wr;

typedef struct tv_wc {
	uint64_t wr_id;
	int status;
	int opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm_data;
	uint32_t qp_num;
	uint32_t src_qp;
	unsigned int wc_flags;
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
} tv_wc;

typedef struct tv_port_attr {
	int state;
	int max_mtu;
	int active_mtu;
	int gid_tbl_len;
	uint32_t port_cap_flags;
	uint32_t max_msg_sz;
	uint32_t bad_pkey_cntr;
	uint32_t qkey_viol_cntr;
	uint16_t pkey_tbl_len;
	uint16_t lid;
	uint16_t sm_lid;
	uint8_t lmc;
	uint8_t max_vl_num;
	uint8_t sm_sl;
	uint8_t subnet_timeout;
	uint8_t init_type_reply;
	uint8_t active_width;
	uint8_t active_speed;
	uint8_t phys_state;
	uint8_t link_layer;
	uint8_t flags;
	uint16_t port_cap_flags2;
} tv_port_attr;

#endif
