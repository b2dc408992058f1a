// A fake libibverbs.so.1 for tests on machines without an RDMA NIC. It has
// the libibverbs binary interface tent uses (transport/rdma/verbs/abi.h,
// checked against the real verbs.h) and behaves like a device where tent
// can observe it:
//
//   devices     FAKEVERBS_DEVICES: names ("fake0,fake1") or a count ("2":
//               fake_0, fake_1); default fake_0,fake_1. Read once per load.
//               One port (1), active, MTU 4096, LID index+1, one GID
//               fe80::<guid>. FAKEVERBS_LINK_LAYER=ethernet makes it RoCE
//               (LID 0). ibdev_path is $FAKEVERBS_SYSFS/<name> when set.
//   objects     contexts, PDs, MRs (lkey, rkey, access), CQs (cqe entries),
//               RC QPs with the RESET→INIT→RTR→RTS→ERR state machine and
//               its required attribute masks; a wrong transition is EINVAL.
//               Destroying a PD, CQ or context still in use is EBUSY.
//   data path   ibv_post_send runs RDMA_WRITE/RDMA_READ at once: the local
//               SGEs must lie in live MRs of the QP's PD (READ needs
//               LOCAL_WRITE) else IBV_WC_LOC_PROT_ERR; the peer QP (found by
//               QPN in the shared tables) must be alive, connected to this QP
//               and at least RTR, else IBV_WC_RETRY_EXC_ERR (a peer process
//               gone too); the remote range must lie in a live MR of the
//               peer's PD with that rkey and the remote access flag, and the
//               peer QP must allow the op, else IBV_WC_REM_ACCESS_ERR. Bytes
//               move with process_vm_writev/readv. An error completion moves
//               the QP to ERR; later WRs complete with IBV_WC_WR_FLUSH_ERR.
//               More than max_send_wr WRs outstanding (not yet retired by a
//               polled completion) is ENOMEM; a full CQ makes ibv_poll_cq
//               fail (overrun).
//   sharing     FAKEVERBS_STATE: a directory shared by the processes of one
//               test; the MR and QP tables live in a file mapped there,
//               locked with flock. Unset: the tables are private to the
//               process.
//   failures    FAKEVERBS_FAIL: rules separated by ','; a rule is a call name
//               then ':key=value' fields: nth=N (only the Nth matching call
//               of this process), dev=NAME, state=INIT|RTR|RTS|ERR|RESET
//               (ibv_modify_qp's target), errno=N. Every entry point is a
//               call name. Two rules act on the data path instead:
//               "cq:error_after=N[:status=S]" completes the WR after the
//               first N executed ones with status S (default
//               IBV_WC_GENERAL_ERR), and "qp:error_after=N" moves the QP
//               to ERR before executing that WR (it and later ones flush).
//               "qp:hold_after=N" keeps every WR after the first N executed
//               ones on the NIC: not executed and not completed until its QP
//               goes to ERR, when it is flushed (IBV_WC_WR_FLUSH_ERR), as a
//               NIC flushes its send queue. A rule with block=PATH (a FIFO)
//               makes its call wait, before it does anything, until a writer
//               opens PATH and writes one byte: a test holds the call there
//               and knows it is there when its own open of PATH returns.
//   GPU memory  FAKEVERBS_CUDA names the fake CUDA driver loaded in the
//               process (cuda/fakecuda); its fakecuda_device_of tells device
//               memory. ibv_reg_mr on device memory fails with EFAULT, as
//               without nvidia-peermem, unless FAKEVERBS_PEERMEM=1.
//               ibv_reg_dmabuf_mr takes only an fd of the fake driver's
//               cuMemGetHandleForAddressRange (a memfd named
//               fakecuda-dmabuf:<addr>:<size>; anything else EINVAL, a closed
//               fd EBADF), offset+length inside it and iova = addr+offset
//               (the fake's device memory is at its own address).
//   counters    fakeverbs_counts reports live contexts, PDs, MRs, CQs, QPs
//               and device lists.
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <dlfcn.h>
#include <unistd.h>

#include "../../verbs/abi.h"

#define MAX_DEVICES 16
#define MAX_MRS 4096
#define MAX_QPS 1024
#define MAX_SEND_WR 16384
#define MAX_SGE 16
#define MAX_CQE 65536
#define NAME_LEN 64

// ---- tables shared between processes --------------------------------------

struct shared_mr {
	int32_t used, pid;
	uint32_t pd, lkey, rkey, access;
	uint64_t addr, len;
	char dev[NAME_LEN];
};

struct shared_qp {
	int32_t used, pid;
	uint32_t qpn, pd, dest_qpn, access;
	int32_t state;
	char dev[NAME_LEN];
};

struct tables {
	uint32_t next_key, next_qpn, next_pd, pad;
	struct shared_mr mrs[MAX_MRS];
	struct shared_qp qps[MAX_QPS];
};

// ---- this process's objects ------------------------------------------------

struct fake_ctx {
	tv_context base;
	int dev;
	int children; // PDs and CQs
};

struct fake_pd {
	tv_pd base;
	int users; // MRs and QPs
};

struct fake_mr {
	tv_mr base;
	int slot;
};

struct fake_cq {
	tv_cq base;
	tv_wc *ring;
	uint32_t *retire; // WRs each completion retires from its QP
	int cap, head, count, overrun, users;
};

// A WR held on the NIC (qp:hold_after) until its QP goes to ERR.
struct held_wr {
	uint64_t wr_id;
	int opcode;
};

struct fake_qp {
	tv_qp base;
	int slot;
	uint32_t max_send_wr, max_sge, outstanding, unretired;
	struct held_wr *held;
	int nheld, held_cap;
	struct fake_qp *next;
};

// All of the fake's process state; one lock guards it.
static struct {
	pthread_mutex_t mu;
	int ready;
	tv_device devices[MAX_DEVICES];
	int ndevices;
	struct tables *tab;
	int tab_fd;
	struct fake_qp *qps;
	int contexts, pds, mrs, cqs, qp_count, lists;
	// failure injection
	char fail_spec[512];
	int rule_hits[32];
	int rule_fired[32];
	uint64_t executed; // WRs executed by this process
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .tab_fd = -1};

int fakeverbs_counts(int *out, int n) {
	pthread_mutex_lock(&g.mu);
	int v[6] = {g.contexts, g.pds, g.mrs, g.cqs, g.qp_count, g.lists};
	pthread_mutex_unlock(&g.mu);
	for (int i = 0; i < n && i < 6; i++) out[i] = v[i];
	return 6;
}

static uint64_t name_hash(const char *s) {
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static void add_device(const char *name) {
	if (g.ndevices >= MAX_DEVICES || *name == 0) return;
	tv_device *d = &g.devices[g.ndevices++];
	snprintf(d->name, sizeof d->name, "%s", name);
	snprintf(d->dev_name, sizeof d->dev_name, "uverbs%d", g.ndevices - 1);
	const char *sysfs = getenv("FAKEVERBS_SYSFS");
	snprintf(d->ibdev_path, sizeof d->ibdev_path, "%s/%s", sysfs ? sysfs : "/sys/class/infiniband", name);
	d->node_type = 1;      // IBV_NODE_CA
	d->transport_type = 0; // IBV_TRANSPORT_IB
}

// Called with g.mu held.
static int setup(void) {
	if (g.ready) return 0;
	const char *env = getenv("FAKEVERBS_DEVICES");
	if (env == NULL) env = "2";
	char *end;
	long n = strtol(env, &end, 10);
	if (*env && *end == 0) {
		for (long i = 0; i < n && i < MAX_DEVICES; i++) {
			char name[NAME_LEN];
			snprintf(name, sizeof name, "fake_%ld", i);
			add_device(name);
		}
	} else {
		char buf[512];
		snprintf(buf, sizeof buf, "%s", env);
		char *save = NULL;
		for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) add_device(t);
	}
	const char *dir = getenv("FAKEVERBS_STATE");
	if (dir && *dir) {
		char path[4096];
		snprintf(path, sizeof path, "%s/fakeverbs.tables", dir);
		int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0) return errno;
		flock(fd, LOCK_EX);
		struct stat st;
		if (fstat(fd, &st) == 0 && st.st_size < (off_t)sizeof(struct tables) &&
		    ftruncate(fd, sizeof(struct tables)) != 0) {
			int e = errno;
			close(fd);
			return e;
		}
		flock(fd, LOCK_UN);
		void *m = mmap(NULL, sizeof(struct tables), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED) {
			int e = errno;
			close(fd);
			return e;
		}
		g.tab = m;
		g.tab_fd = fd;
	} else {
		void *m = mmap(NULL, sizeof(struct tables), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED) return errno;
		g.tab = m;
	}
	g.ready = 1;
	return 0;
}

static void lock_tables(void) {
	if (g.tab_fd >= 0) flock(g.tab_fd, LOCK_EX);
}

static void unlock_tables(void) {
	if (g.tab_fd >= 0) flock(g.tab_fd, LOCK_UN);
}

static int pid_alive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }

// Every entry of the shared tables starts with used, pid.
_Static_assert(offsetof(struct shared_mr, used) == 0 && offsetof(struct shared_mr, pid) == 4, "shared_mr head");
_Static_assert(offsetof(struct shared_qp, used) == 0 && offsetof(struct shared_qp, pid) == 4, "shared_qp head");

// free_slot: the first entry of a shared table (n entries of stride
// bytes) that is unused or whose owner died, or -1. Tables locked.
static int free_slot(void *table, size_t stride, int n) {
	for (int i = 0; i < n; i++) {
		const int32_t *head = (const int32_t *)((char *)table + (size_t)i * stride);
		if (!head[0] || !pid_alive(head[1])) return i;
	}
	return -1;
}

// ---- failure injection -----------------------------------------------------

struct rule {
	char call[48], dev[NAME_LEN], state[16], block[256];
	long nth, err, error_after, hold_after, status;
};

static int parse_rules(struct rule *rules, int max) {
	const char *spec = getenv("FAKEVERBS_FAIL");
	if (spec == NULL) spec = "";
	if (strncmp(spec, g.fail_spec, sizeof g.fail_spec) != 0) {
		// A new spec: its counters start again.
		snprintf(g.fail_spec, sizeof g.fail_spec, "%s", spec);
		memset(g.rule_hits, 0, sizeof g.rule_hits);
		memset(g.rule_fired, 0, sizeof g.rule_fired);
		g.executed = 0;
	}
	char buf[512];
	snprintf(buf, sizeof buf, "%s", spec);
	int n = 0;
	char *save = NULL;
	for (char *r = strtok_r(buf, ",", &save); r && n < max; r = strtok_r(NULL, ",", &save)) {
		struct rule *x = &rules[n++];
		memset(x, 0, sizeof *x);
		x->error_after = -1;
		x->hold_after = -1;
		char *save2 = NULL;
		char *f = strtok_r(r, ":", &save2);
		snprintf(x->call, sizeof x->call, "%s", f ? f : "");
		while ((f = strtok_r(NULL, ":", &save2)) != NULL) {
			char *eq = strchr(f, '=');
			if (!eq) continue;
			*eq++ = 0;
			if (!strcmp(f, "nth")) x->nth = atol(eq);
			else if (!strcmp(f, "dev")) snprintf(x->dev, sizeof x->dev, "%s", eq);
			else if (!strcmp(f, "state")) snprintf(x->state, sizeof x->state, "%s", eq);
			else if (!strcmp(f, "errno")) x->err = atol(eq);
			else if (!strcmp(f, "error_after")) x->error_after = atol(eq);
			else if (!strcmp(f, "hold_after")) x->hold_after = atol(eq);
			else if (!strcmp(f, "block")) snprintf(x->block, sizeof x->block, "%s", eq);
			else if (!strcmp(f, "status")) x->status = atol(eq);
		}
	}
	return n;
}

// The errno an injected failure of call gives, or 0. g.mu held.
static int injected(const char *call, const char *dev, const char *state, int deflt) {
	struct rule rules[32];
	int n = parse_rules(rules, 32);
	for (int i = 0; i < n; i++) {
		struct rule *r = &rules[i];
		if (strcmp(r->call, call) != 0 || r->block[0]) continue;
		if (r->dev[0] && (!dev || strcmp(r->dev, dev) != 0)) continue;
		if (r->state[0] && (!state || strcmp(r->state, state) != 0)) continue;
		int hit = ++g.rule_hits[i];
		if (r->nth && hit != r->nth) continue;
		return r->err ? (int)r->err : deflt;
	}
	return 0;
}

// Waits where a block=PATH rule for call says to (see the header). Takes
// and releases g.mu itself: the call waits holding no lock, so the rest of
// the library (a poller, the other side of a test) runs meanwhile.
static void maybe_block(const char *call, const char *dev) {
	char path[256] = "";
	pthread_mutex_lock(&g.mu);
	struct rule rules[32];
	int n = parse_rules(rules, 32);
	for (int i = 0; i < n; i++) {
		struct rule *r = &rules[i];
		if (!r->block[0] || strcmp(r->call, call) != 0) continue;
		if (r->dev[0] && (!dev || strcmp(r->dev, dev) != 0)) continue;
		int hit = ++g.rule_hits[i];
		if (r->nth && hit != r->nth) continue;
		snprintf(path, sizeof path, "%s", r->block);
		break;
	}
	pthread_mutex_unlock(&g.mu);
	if (!path[0]) return;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) return;
	char b;
	while (read(fd, &b, 1) < 0 && errno == EINTR) {
	}
	close(fd);
}

// Whether the WR about to run stays on the NIC (qp:hold_after). g.mu held.
static int hold_rule(const char *dev) {
	struct rule rules[32];
	int n = parse_rules(rules, 32);
	for (int i = 0; i < n; i++) {
		struct rule *r = &rules[i];
		if (r->hold_after < 0 || strcmp(r->call, "qp") != 0 || (long)g.executed < r->hold_after) continue;
		if (r->dev[0] && strcmp(r->dev, dev) != 0) continue;
		return 1;
	}
	return 0;
}

// Appends a completion to cq; retire is how many WRs of its QP it retires.
// A full CQ overruns (ibv_poll_cq fails from then on). g.mu held.
static void push_wc(struct fake_cq *cq, tv_qp *qp, uint64_t wr_id, int opcode, int status, uint32_t bytes,
		    uint32_t retire) {
	if (cq->count == cq->cap) {
		cq->overrun = 1;
		return;
	}
	int tail = (cq->head + cq->count) % cq->cap;
	tv_wc *c = &cq->ring[tail];
	memset(c, 0, sizeof *c);
	c->wr_id = wr_id;
	c->status = status;
	c->opcode = opcode == TV_WR_RDMA_WRITE ? TV_WC_RDMA_WRITE : TV_WC_RDMA_READ;
	c->byte_len = status == TV_WC_SUCCESS && opcode == TV_WR_RDMA_READ ? bytes : 0;
	c->qp_num = qp->qp_num;
	cq->retire[tail] = retire;
	cq->count++;
}

// Flushes the WRs held on q's NIC: each completes with
// IBV_WC_WR_FLUSH_ERR, in the order posted. Called as q enters ERR. g.mu
// held.
static void flush_held(struct fake_qp *q) {
	for (int i = 0; i < q->nheld; i++) {
		push_wc((struct fake_cq *)q->base.send_cq, &q->base, q->held[i].wr_id, q->held[i].opcode,
			TV_WC_WR_FLUSH_ERR, 0, q->unretired + 1);
		q->unretired = 0;
	}
	q->nheld = 0;
}

// Data-path rules for the WR about to execute (the g.executed+1-th). Sets
// *status to the completion status to force, or *to_error to move the QP to
// ERR first. g.mu held.
static void data_path_rules(const char *dev, int *status, int *to_error) {
	struct rule rules[32];
	int n = parse_rules(rules, 32);
	for (int i = 0; i < n; i++) {
		struct rule *r = &rules[i];
		if (r->error_after < 0 || g.rule_fired[i] || (long)g.executed < r->error_after) continue;
		if (r->dev[0] && strcmp(r->dev, dev) != 0) continue;
		if (!strcmp(r->call, "cq")) {
			g.rule_fired[i] = 1;
			*status = r->status ? (int)r->status : TV_WC_GENERAL_ERR;
		} else if (!strcmp(r->call, "qp")) {
			g.rule_fired[i] = 1;
			*to_error = 1;
		}
	}
}

#define FAIL_IF(call, dev, state, deflt)                          \
	do {                                                      \
		int e_ = injected(call, dev, state, deflt);       \
		if (e_) {                                         \
			pthread_mutex_unlock(&g.mu);              \
			errno = e_;                               \
			return FAIL_VALUE;                        \
		}                                                 \
	} while (0)

static const char *dev_name(tv_context *ctx) { return ctx->device->name; }

// ---- devices and contexts --------------------------------------------------

#define FAIL_VALUE NULL
tv_device **ibv_get_device_list(int *num) {
	pthread_mutex_lock(&g.mu);
	FAIL_IF("ibv_get_device_list", NULL, NULL, ENOSYS);
	int e = setup();
	if (e) {
		pthread_mutex_unlock(&g.mu);
		errno = e;
		return NULL;
	}
	tv_device **list = calloc((size_t)g.ndevices + 1, sizeof *list);
	if (list == NULL) {
		pthread_mutex_unlock(&g.mu);
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < g.ndevices; i++) list[i] = &g.devices[i];
	if (num) *num = g.ndevices;
	g.lists++;
	pthread_mutex_unlock(&g.mu);
	return list;
}

void ibv_free_device_list(tv_device **list) {
	if (list == NULL) return;
	free(list);
	pthread_mutex_lock(&g.mu);
	g.lists--;
	pthread_mutex_unlock(&g.mu);
}

const char *ibv_get_device_name(tv_device *dev) { return dev ? dev->name : NULL; }

uint64_t ibv_get_device_guid(tv_device *dev) { return htobe64(dev ? name_hash(dev->name) : 0); }

static int fake_poll_cq(tv_cq *cq, int n, tv_wc *wc);
static int fake_post_send(tv_qp *qp, tv_send_wr *wr, tv_send_wr **bad);

tv_context *ibv_open_device(tv_device *dev) {
	pthread_mutex_lock(&g.mu);
	int idx = dev ? (int)(dev - g.devices) : -1;
	if (!g.ready || idx < 0 || idx >= g.ndevices) {
		pthread_mutex_unlock(&g.mu);
		errno = ENODEV;
		return NULL;
	}
	FAIL_IF("ibv_open_device", dev->name, NULL, ENODEV);
	struct fake_ctx *c = calloc(1, sizeof *c);
	if (c == NULL) {
		pthread_mutex_unlock(&g.mu);
		errno = ENOMEM;
		return NULL;
	}
	c->base.device = dev;
	c->base.ops.poll_cq = fake_poll_cq;
	c->base.ops.post_send = fake_post_send;
	c->base.cmd_fd = -1;
	c->base.async_fd = -1;
	c->base.num_comp_vectors = 1;
	pthread_mutex_init(&c->base.mutex, NULL);
	c->dev = idx;
	g.contexts++;
	// Peers read and write this process's registered memory as a NIC
	// would; where Yama restricts ptrace to descendants, allow them.
	prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	pthread_mutex_unlock(&g.mu);
	return &c->base;
}

#undef FAIL_VALUE
#define FAIL_VALUE e_

int ibv_close_device(tv_context *ctx) {
	struct fake_ctx *c = (struct fake_ctx *)ctx;
	pthread_mutex_lock(&g.mu);
	FAIL_IF("ibv_close_device", dev_name(ctx), NULL, EIO);
	if (c->children > 0) {
		pthread_mutex_unlock(&g.mu);
		return EBUSY;
	}
	pthread_mutex_destroy(&c->base.mutex);
	free(c);
	g.contexts--;
	pthread_mutex_unlock(&g.mu);
	return 0;
}

int ibv_query_port(tv_context *ctx, uint8_t port, tv_port_attr *attr) {
	struct fake_ctx *c = (struct fake_ctx *)ctx;
	pthread_mutex_lock(&g.mu);
	FAIL_IF("ibv_query_port", dev_name(ctx), NULL, EIO);
	pthread_mutex_unlock(&g.mu);
	if (port != 1) return EINVAL;
	const char *ll = getenv("FAKEVERBS_LINK_LAYER");
	int eth = ll && !strcmp(ll, "ethernet");
	memset(attr, 0, sizeof *attr);
	attr->state = TV_PORT_ACTIVE;
	attr->max_mtu = TV_MTU_4096;
	attr->active_mtu = TV_MTU_4096;
	attr->gid_tbl_len = 1;
	attr->max_msg_sz = 1u << 31;
	attr->pkey_tbl_len = 1;
	attr->lid = eth ? 0 : (uint16_t)(c->dev + 1);
	attr->link_layer = eth ? TV_LINK_LAYER_ETHERNET : TV_LINK_LAYER_INFINIBAND;
	attr->phys_state = 5; // LinkUp
	return 0;
}

int ibv_query_gid(tv_context *ctx, uint8_t port, int index, tv_gid *gid) {
	pthread_mutex_lock(&g.mu);
	FAIL_IF("ibv_query_gid", dev_name(ctx), NULL, EIO);
	pthread_mutex_unlock(&g.mu);
	if (port != 1 || index != 0) return EINVAL;
	memset(gid, 0, sizeof *gid);
	gid->raw[0] = 0xfe;
	gid->raw[1] = 0x80;
	uint64_t guid = htobe64(name_hash(ctx->device->name));
	memcpy(&gid->raw[8], &guid, 8);
	return 0;
}

// ---- PDs and MRs -----------------------------------------------------------

#undef FAIL_VALUE
#define FAIL_VALUE NULL

tv_pd *ibv_alloc_pd(tv_context *ctx) {
	struct fake_ctx *c = (struct fake_ctx *)ctx;
	pthread_mutex_lock(&g.mu);
	FAIL_IF("ibv_alloc_pd", dev_name(ctx), NULL, ENOMEM);
	struct fake_pd *p = calloc(1, sizeof *p);
	if (p == NULL) {
		pthread_mutex_unlock(&g.mu);
		errno = ENOMEM;
		return NULL;
	}
	p->base.context = ctx;
	lock_tables();
	p->base.handle = ++g.tab->next_pd;
	unlock_tables();
	c->children++;
	g.pds++;
	pthread_mutex_unlock(&g.mu);
	return &p->base;
}

#undef FAIL_VALUE
#define FAIL_VALUE e_

int ibv_dealloc_pd(tv_pd *pd) {
	struct fake_pd *p = (struct fake_pd *)pd;
	pthread_mutex_lock(&g.mu);
	FAIL_IF("ibv_dealloc_pd", dev_name(pd->context), NULL, EIO);
	if (p->users > 0) {
		pthread_mutex_unlock(&g.mu);
		return EBUSY;
	}
	((struct fake_ctx *)pd->context)->children--;
	free(p);
	g.pds--;
	pthread_mutex_unlock(&g.mu);
	return 0;
}

#undef FAIL_VALUE
#define FAIL_VALUE NULL

static tv_mr *reg(const char *call, tv_pd *pd, void *addr, size_t length, int access) {
	pthread_mutex_lock(&g.mu);
	FAIL_IF(call, dev_name(pd->context), NULL, ENOMEM);
	const int known = TV_ACCESS_LOCAL_WRITE | TV_ACCESS_REMOTE_WRITE | TV_ACCESS_REMOTE_READ;
	// As the kernel: remote write needs local write; no unknown bits.
	if ((access & ~known) || ((access & TV_ACCESS_REMOTE_WRITE) && !(access & TV_ACCESS_LOCAL_WRITE)) ||
	    length == 0 || addr == NULL) {
		pthread_mutex_unlock(&g.mu);
		errno = EINVAL;
		return NULL;
	}
	struct fake_mr *m = calloc(1, sizeof *m);
	if (m == NULL) {
		pthread_mutex_unlock(&g.mu);
		errno = ENOMEM;
		return NULL;
	}
	lock_tables();
	int slot = free_slot(g.tab->mrs, sizeof g.tab->mrs[0], MAX_MRS);
	if (slot < 0) {
		unlock_tables();
		pthread_mutex_unlock(&g.mu);
		free(m);
		errno = ENOMEM;
		return NULL;
	}
	uint32_t key = ++g.tab->next_key;
	struct shared_mr *s = &g.tab->mrs[slot];
	memset(s, 0, sizeof *s);
	s->used = 1;
	s->pid = getpid();
	s->pd = pd->handle;
	s->lkey = key << 8 | 0x11;
	s->rkey = key << 8 | 0x22;
	s->access = (uint32_t)access;
	s->addr = (uint64_t)(uintptr_t)addr;
	s->len = length;
	snprintf(s->dev, sizeof s->dev, "%s", dev_name(pd->context));
	unlock_tables();
	m->slot = slot;
	m->base.context = pd->context;
	m->base.pd = pd;
	m->base.addr = addr;
	m->base.length = length;
	m->base.handle = key;
	m->base.lkey = s->lkey;
	m->base.rkey = s->rkey;
	((struct fake_pd *)pd)->users++;
	g.mrs++;
	pthread_mutex_unlock(&g.mu);
	return &m->base;
}

// The fake CUDA device addr is memory of, or -1 (FAKEVERBS_CUDA unset or
// not loaded: no GPU memory here).
static int cuda_device_of(void *addr) {
	const char *path = getenv("FAKEVERBS_CUDA");
	if (path == NULL || *path == 0) return -1;
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL) return -1;
	int (*f)(unsigned long long) = (int (*)(unsigned long long))dlsym(h, "fakecuda_device_of");
	int dev = f ? f((unsigned long long)(uintptr_t)addr) : -1;
	dlclose(h);
	return dev;
}

tv_mr *ibv_reg_mr(tv_pd *pd, void *addr, size_t length, int access) {
	// Pinning device memory needs the peer-memory module (nvidia-peermem).
	const char *peermem = getenv("FAKEVERBS_PEERMEM");
	if (cuda_device_of(addr) >= 0 && !(peermem && !strcmp(peermem, "1"))) {
		pthread_mutex_lock(&g.mu);
		FAIL_IF("ibv_reg_mr", dev_name(pd->context), NULL, ENOMEM);
		pthread_mutex_unlock(&g.mu);
		errno = EFAULT;
		return NULL;
	}
	return reg("ibv_reg_mr", pd, addr, length, access);
}

// The range a fake CUDA dmabuf fd stands for (see the header); errno when
// fd is not one.
static int dmabuf_range(int fd, uint64_t *base, uint64_t *size) {
	char link[64], target[256];
	snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, target, sizeof target - 1);
	if (n < 0) return EBADF;
	target[n] = 0;
	unsigned long long b, sz;
	if (sscanf(target, "/memfd:fakecuda-dmabuf:%llx:%llx", &b, &sz) != 2) return EINVAL;
	*base = b, *size = sz;
	return 0;
}

tv_mr *ibv_reg_dmabuf_mr(tv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) {
	uint64_t base = 0, size = 0;
	int e = dmabuf_range(fd, &base, &size);
	if (e == 0 && (offset > size || length > size - offset || iova != base + offset)) e = EINVAL;
	if (e) {
		pthread_mutex_lock(&g.mu);
		FAIL_IF("ibv_reg_dmabuf_mr", dev_name(pd->context), NULL, ENOMEM);
		pthread_mutex_unlock(&g.mu);
		errno = e;
		return NULL;
	}
	return reg("ibv_reg_dmabuf_mr", pd, (void *)(uintptr_t)iova, length, access);
}

#undef FAIL_VALUE
#define FAIL_VALUE e_

int ibv_dereg_mr(tv_mr *mr) {
	struct fake_mr *m = (struct fake_mr *)mr;
	pthread_mutex_lock(&g.mu);
	FAIL_IF("ibv_dereg_mr", dev_name(mr->context), NULL, EIO);
	lock_tables();
	memset(&g.tab->mrs[m->slot], 0, sizeof g.tab->mrs[m->slot]);
	unlock_tables();
	((struct fake_pd *)mr->pd)->users--;
	free(m);
	g.mrs--;
	pthread_mutex_unlock(&g.mu);
	return 0;
}

// ---- CQs ---------------------------------------------------------------------

#undef FAIL_VALUE
#define FAIL_VALUE NULL

tv_cq *ibv_create_cq(tv_context *ctx, int cqe, void *cq_context, void *channel, int comp_vector) {
	(void)comp_vector;
	pthread_mutex_lock(&g.mu);
	FAIL_IF("ibv_create_cq", dev_name(ctx), NULL, ENOMEM);
	if (cqe < 1 || cqe > MAX_CQE || channel != NULL) {
		pthread_mutex_unlock(&g.mu);
		errno = EINVAL;
		return NULL;
	}
	struct fake_cq *q = calloc(1, sizeof *q);
	tv_wc *ring = calloc((size_t)cqe, sizeof *ring);
	uint32_t *retire = calloc((size_t)cqe, sizeof *retire);
	if (!q || !ring || !retire) {
		free(q), free(ring), free(retire);
		pthread_mutex_unlock(&g.mu);
		errno = ENOMEM;
		return NULL;
	}
	q->base.context = ctx;
	q->base.cq_context = cq_context;
	q->base.cqe = cqe;
	pthread_mutex_init(&q->base.mutex, NULL);
	pthread_cond_init(&q->base.cond, NULL);
	q->ring = ring;
	q->retire = retire;
	q->cap = cqe;
	((struct fake_ctx *)ctx)->children++;
	g.cqs++;
	pthread_mutex_unlock(&g.mu);
	return &q->base;
}

#undef FAIL_VALUE
#define FAIL_VALUE e_

int ibv_destroy_cq(tv_cq *cq) {
	struct fake_cq *q = (struct fake_cq *)cq;
	pthread_mutex_lock(&g.mu);
	FAIL_IF("ibv_destroy_cq", dev_name(cq->context), NULL, EIO);
	if (q->users > 0) {
		pthread_mutex_unlock(&g.mu);
		return EBUSY;
	}
	((struct fake_ctx *)cq->context)->children--;
	pthread_mutex_destroy(&q->base.mutex);
	pthread_cond_destroy(&q->base.cond);
	free(q->ring);
	free(q->retire);
	free(q);
	g.cqs--;
	pthread_mutex_unlock(&g.mu);
	return 0;
}

static struct fake_qp *local_qp(uint32_t qpn) {
	for (struct fake_qp *q = g.qps; q; q = q->next)
		if (q->base.qp_num == qpn) return q;
	return NULL;
}

static int fake_poll_cq(tv_cq *cq, int n, tv_wc *wc) {
	struct fake_cq *q = (struct fake_cq *)cq;
	pthread_mutex_lock(&g.mu);
	int e = injected("ibv_poll_cq", dev_name(cq->context), NULL, EIO);
	if (e || q->overrun) {
		pthread_mutex_unlock(&g.mu);
		return -1;
	}
	int got = 0;
	while (got < n && q->count > 0) {
		wc[got] = q->ring[q->head];
		struct fake_qp *qp = local_qp(wc[got].qp_num);
		if (qp) qp->outstanding -= q->retire[q->head] < qp->outstanding ? q->retire[q->head] : qp->outstanding;
		q->head = (q->head + 1) % q->cap;
		q->count--;
		got++;
	}
	pthread_mutex_unlock(&g.mu);
	return got;
}

// ---- QPs ---------------------------------------------------------------------

#undef FAIL_VALUE
#define FAIL_VALUE NULL

tv_qp *ibv_create_qp(tv_pd *pd, tv_qp_init_attr *attr) {
	maybe_block("ibv_create_qp", dev_name(pd->context));
	pthread_mutex_lock(&g.mu);
	FAIL_IF("ibv_create_qp", dev_name(pd->context), NULL, ENOMEM);
	tv_qp_cap *cap = &attr->cap;
	if (attr->qp_type != TV_QPT_RC || attr->srq != NULL || !attr->send_cq || !attr->recv_cq ||
	    attr->send_cq->context != pd->context || attr->recv_cq->context != pd->context ||
	    cap->max_send_wr < 1 || cap->max_send_wr > MAX_SEND_WR || cap->max_recv_wr > MAX_SEND_WR ||
	    cap->max_send_sge < 1 || cap->max_send_sge > MAX_SGE || cap->max_recv_sge > MAX_SGE || cap->max_inline_data > 0) {
		pthread_mutex_unlock(&g.mu);
		errno = EINVAL;
		return NULL;
	}
	struct fake_qp *q = calloc(1, sizeof *q);
	if (q == NULL) {
		pthread_mutex_unlock(&g.mu);
		errno = ENOMEM;
		return NULL;
	}
	lock_tables();
	int slot = free_slot(g.tab->qps, sizeof g.tab->qps[0], MAX_QPS);
	if (slot < 0) {
		unlock_tables();
		pthread_mutex_unlock(&g.mu);
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	struct shared_qp *s = &g.tab->qps[slot];
	memset(s, 0, sizeof *s);
	s->used = 1;
	s->pid = getpid();
	s->qpn = (++g.tab->next_qpn & 0xffffff) | 0x100; // QPN 0 and 1 are special
	s->pd = pd->handle;
	s->state = TV_QPS_RESET;
	snprintf(s->dev, sizeof s->dev, "%s", dev_name(pd->context));
	unlock_tables();
	q->slot = slot;
	q->base.context = pd->context;
	q->base.qp_context = attr->qp_context;
	q->base.pd = pd;
	q->base.send_cq = attr->send_cq;
	q->base.recv_cq = attr->recv_cq;
	q->base.handle = s->qpn;
	q->base.qp_num = s->qpn;
	q->base.state = TV_QPS_RESET;
	q->base.qp_type = TV_QPT_RC;
	pthread_mutex_init(&q->base.mutex, NULL);
	pthread_cond_init(&q->base.cond, NULL);
	q->max_send_wr = cap->max_send_wr;
	q->max_sge = cap->max_send_sge;
	q->next = g.qps;
	g.qps = q;
	((struct fake_pd *)pd)->users++;
	((struct fake_cq *)attr->send_cq)->users++;
	((struct fake_cq *)attr->recv_cq)->users++;
	g.qp_count++;
	pthread_mutex_unlock(&g.mu);
	return &q->base;
}

static const char *state_name(int s) {
	static const char *names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
	return s >= 0 && s <= TV_QPS_ERR ? names[s] : "?";
}

// Sets the QP's state here and in the shared table. g.mu held.
static void set_state(struct fake_qp *q, int state) {
	if (state == TV_QPS_ERR && q->base.state != TV_QPS_ERR) flush_held(q);
	q->base.state = state;
	lock_tables();
	g.tab->qps[q->slot].state = state;
	unlock_tables();
}

#undef FAIL_VALUE
#define FAIL_VALUE e_

int ibv_modify_qp(tv_qp *qp, tv_qp_attr *attr, int mask) {
	struct fake_qp *q = (struct fake_qp *)qp;
	pthread_mutex_lock(&g.mu);
	int cur = qp->state, next = attr->qp_state;
	FAIL_IF("ibv_modify_qp", dev_name(qp->context), (mask & TV_QP_STATE) ? state_name(next) : NULL, EINVAL);
	int ok = 0;
	if (!(mask & TV_QP_STATE)) ok = 0;
	else if (next == TV_QPS_RESET || next == TV_QPS_ERR) ok = 1;
	else if (cur == TV_QPS_RESET && next == TV_QPS_INIT) {
		const int need = TV_QP_STATE | TV_QP_PKEY_INDEX | TV_QP_PORT | TV_QP_ACCESS_FLAGS;
		ok = (mask & need) == need && attr->port_num == 1 && attr->pkey_index == 0;
	} else if (cur == TV_QPS_INIT && next == TV_QPS_RTR) {
		const int need = TV_QP_STATE | TV_QP_AV | TV_QP_PATH_MTU | TV_QP_DEST_QPN | TV_QP_RQ_PSN |
				 TV_QP_MAX_DEST_RD_ATOMIC | TV_QP_MIN_RNR_TIMER;
		ok = (mask & need) == need && attr->path_mtu >= 1 && attr->path_mtu <= TV_MTU_4096 &&
		     attr->ah_attr.port_num == 1;
	} else if (cur == TV_QPS_RTR && next == TV_QPS_RTS) {
		const int need = TV_QP_STATE | TV_QP_SQ_PSN | TV_QP_TIMEOUT | TV_QP_RETRY_CNT | TV_QP_RNR_RETRY |
				 TV_QP_MAX_QP_RD_ATOMIC;
		ok = (mask & need) == need;
	} else if ((cur == TV_QPS_INIT && next == TV_QPS_INIT) || (cur == TV_QPS_RTS && next == TV_QPS_RTS)) {
		ok = 1;
	}
	if (!ok) {
		pthread_mutex_unlock(&g.mu);
		return EINVAL;
	}
	lock_tables();
	struct shared_qp *s = &g.tab->qps[q->slot];
	if (next == TV_QPS_INIT && (mask & TV_QP_ACCESS_FLAGS)) s->access = attr->qp_access_flags;
	if (next == TV_QPS_RTR) s->dest_qpn = attr->dest_qp_num;
	if (next == TV_QPS_RESET) s->dest_qpn = 0, s->access = 0;
	s->state = next;
	unlock_tables();
	if (next == TV_QPS_ERR && cur != TV_QPS_ERR) flush_held(q);
	qp->state = next;
	if (next == TV_QPS_RESET) q->outstanding = q->unretired = q->nheld = 0;
	pthread_mutex_unlock(&g.mu);
	return 0;
}

int ibv_destroy_qp(tv_qp *qp) {
	struct fake_qp *q = (struct fake_qp *)qp;
	pthread_mutex_lock(&g.mu);
	FAIL_IF("ibv_destroy_qp", dev_name(qp->context), NULL, EIO);
	lock_tables();
	memset(&g.tab->qps[q->slot], 0, sizeof g.tab->qps[q->slot]);
	unlock_tables();
	for (struct fake_qp **p = &g.qps; *p; p = &(*p)->next)
		if (*p == q) {
			*p = q->next;
			break;
		}
	((struct fake_pd *)qp->pd)->users--;
	((struct fake_cq *)qp->send_cq)->users--;
	((struct fake_cq *)qp->recv_cq)->users--;
	pthread_mutex_destroy(&q->base.mutex);
	pthread_cond_destroy(&q->base.cond);
	free(q->held);
	free(q);
	g.qp_count--;
	pthread_mutex_unlock(&g.mu);
	return 0;
}

// ---- the data path -----------------------------------------------------------

// Runs one WR; returns its completion status. g.mu and the tables held.
static int execute(struct fake_qp *q, tv_send_wr *wr, uint32_t *bytes) {
	struct tables *t = g.tab;
	struct iovec local[MAX_SGE];
	uint64_t total = 0;
	int me = getpid();
	for (int i = 0; i < wr->num_sge; i++) {
		tv_sge *sge = &wr->sg_list[i];
		int found = 0;
		for (int k = 0; k < MAX_MRS && !found; k++) {
			struct shared_mr *m = &t->mrs[k];
			if (!m->used || m->pid != me || m->lkey != sge->lkey || m->pd != q->base.pd->handle) continue;
			if (sge->addr < m->addr || sge->addr + sge->length > m->addr + m->len) break;
			if (wr->opcode == TV_WR_RDMA_READ && !(m->access & TV_ACCESS_LOCAL_WRITE)) break;
			found = 1;
		}
		if (!found) return TV_WC_LOC_PROT_ERR;
		local[i].iov_base = (void *)(uintptr_t)sge->addr;
		local[i].iov_len = sge->length;
		total += sge->length;
	}
	*bytes = (uint32_t)total;
	struct shared_qp *peer = NULL;
	uint32_t dest = t->qps[q->slot].dest_qpn;
	for (int k = 0; k < MAX_QPS; k++)
		if (t->qps[k].used && t->qps[k].qpn == dest) {
			peer = &t->qps[k];
			break;
		}
	// No answer from the other end: the transport retries, then gives up.
	if (!peer || !pid_alive(peer->pid) || peer->dest_qpn != q->base.qp_num || peer->state < TV_QPS_RTR ||
	    peer->state == TV_QPS_ERR)
		return TV_WC_RETRY_EXC_ERR;
	uint32_t need = wr->opcode == TV_WR_RDMA_WRITE ? TV_ACCESS_REMOTE_WRITE : TV_ACCESS_REMOTE_READ;
	if (!(peer->access & need)) return TV_WC_REM_ACCESS_ERR;
	struct shared_mr *rm = NULL;
	for (int k = 0; k < MAX_MRS; k++) {
		struct shared_mr *m = &t->mrs[k];
		if (m->used && m->rkey == wr->rkey && m->pid == peer->pid && m->pd == peer->pd &&
		    !strncmp(m->dev, peer->dev, NAME_LEN)) {
			rm = m;
			break;
		}
	}
	if (!rm || !(rm->access & need) || wr->remote_addr < rm->addr || total > rm->len ||
	    wr->remote_addr - rm->addr > rm->len - total)
		return TV_WC_REM_ACCESS_ERR;
	if (total == 0) return TV_WC_SUCCESS;
	struct iovec remote = {.iov_base = (void *)(uintptr_t)wr->remote_addr, .iov_len = total};
	ssize_t n = wr->opcode == TV_WR_RDMA_WRITE ? process_vm_writev(peer->pid, local, (unsigned long)wr->num_sge, &remote, 1, 0)
						   : process_vm_readv(peer->pid, local, (unsigned long)wr->num_sge, &remote, 1, 0);
	if (n == (ssize_t)total) return TV_WC_SUCCESS;
	if (n < 0 && errno == ESRCH) return TV_WC_RETRY_EXC_ERR;
	return TV_WC_REM_ACCESS_ERR;
}

static int fake_post_send(tv_qp *qp, tv_send_wr *wr, tv_send_wr **bad) {
	struct fake_qp *q = (struct fake_qp *)qp;
	struct fake_cq *cq = (struct fake_cq *)qp->send_cq;
	const char *dev = dev_name(qp->context);
	pthread_mutex_lock(&g.mu);
	int e = injected("ibv_post_send", dev, NULL, EIO);
	if (e) {
		*bad = wr;
		pthread_mutex_unlock(&g.mu);
		return e;
	}
	for (; wr; wr = wr->next) {
		if (qp->state != TV_QPS_RTS && qp->state != TV_QPS_ERR && qp->state != TV_QPS_SQD) e = EINVAL;
		else if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_sge) e = EINVAL;
		else if (wr->opcode != TV_WR_RDMA_WRITE && wr->opcode != TV_WR_RDMA_READ) e = EINVAL;
		else if (q->outstanding >= q->max_send_wr) e = ENOMEM;
		if (e) {
			*bad = wr;
			pthread_mutex_unlock(&g.mu);
			return e;
		}
		int status = TV_WC_SUCCESS, to_error = 0;
		uint32_t bytes = 0;
		// In order: nothing runs past a held WR.
		if (qp->state == TV_QPS_RTS && (q->nheld > 0 || hold_rule(dev))) {
			if (q->nheld == q->held_cap) {
				int cap = q->held_cap ? 2 * q->held_cap : 64;
				struct held_wr *h = realloc(q->held, (size_t)cap * sizeof *h);
				if (h == NULL) {
					*bad = wr;
					pthread_mutex_unlock(&g.mu);
					return ENOMEM;
				}
				q->held = h;
				q->held_cap = cap;
			}
			q->held[q->nheld++] = (struct held_wr){wr->wr_id, wr->opcode};
			q->outstanding++;
			continue;
		}
		if (qp->state == TV_QPS_RTS) data_path_rules(dev, &status, &to_error);
		if (to_error) set_state(q, TV_QPS_ERR);
		if (qp->state == TV_QPS_ERR) {
			status = TV_WC_WR_FLUSH_ERR;
		} else if (status == TV_WC_SUCCESS) {
			lock_tables();
			status = execute(q, wr, &bytes);
			unlock_tables();
			g.executed++;
		} else {
			g.executed++;
		}
		q->outstanding++;
		q->unretired++;
		if (status != TV_WC_SUCCESS && qp->state != TV_QPS_ERR) set_state(q, TV_QPS_ERR);
		// Errors always complete; successes only when signalled.
		if (status == TV_WC_SUCCESS && !(wr->send_flags & TV_SEND_SIGNALED)) continue;
		push_wc(cq, qp, wr->wr_id, wr->opcode, status, bytes, q->unretired);
		q->unretired = 0;
	}
	pthread_mutex_unlock(&g.mu);
	return 0;
}
