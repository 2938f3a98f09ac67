/* ring.c - the ring as ktl_uring.c sets it up, the provided buffer ring, the probe that tells
 * whether the kernel takes a variant at all, and the one that picks how --drain tells that
 * deferred task work is left. */

#include "ringrecv.h"

/* The ring as ktl_ring_create/ktl_ring_start make it; taskrun_flag adds IORING_SETUP_TASKRUN_FLAG
 * (the kernel then shows pending deferred task work as IORING_SQ_TASKRUN). */
int ring_setup(struct io_uring *ring, int taskrun_flag, char *why, size_t whylen)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SUBMIT_ALL
        | IORING_SETUP_CQSIZE | IORING_SETUP_R_DISABLED | (taskrun_flag ? IORING_SETUP_TASKRUN_FLAG : 0);
    p.cq_entries = RING_ENTRIES * 4;
    int r = io_uring_queue_init_params(RING_ENTRIES, ring, &p);
    if (r < 0) {
        snprintf(why, whylen, "io_uring_setup(SINGLE_ISSUER|DEFER_TASKRUN|SUBMIT_ALL|CQSIZE%s): %s",
                 taskrun_flag ? "|TASKRUN_FLAG" : "", strerror(-r));
        return -1;
    }
    r = io_uring_enable_rings(ring);
    if (r < 0) {
        snprintf(why, whylen, "IORING_REGISTER_ENABLE_RINGS: %s", strerror(-r));
        io_uring_queue_exit(ring);
        return -1;
    }
    if (io_uring_register_ring_fd(ring) != 1) {
        snprintf(why, whylen, "IORING_REGISTER_RING_FDS failed");
        io_uring_queue_exit(ring);
        return -1;
    }
    return 0;
}

/* Registers buffer group BGID with `entries` entries; the ring memory is page aligned. */
int bufring_register(struct io_uring *ring, unsigned entries, int inc, struct io_uring_buf_ring **out,
                     size_t *bytes, char *why, size_t whylen)
{
    size_t len = (size_t)entries * sizeof(struct io_uring_buf);
    long page = sysconf(_SC_PAGESIZE);
    len = (len + (size_t)page - 1) & ~((size_t)page - 1);
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        snprintf(why, whylen, "mmap of the buffer ring: %s", strerror(errno));
        return -1;
    }
    struct io_uring_buf_ring *br = mem;
    io_uring_buf_ring_init(br);
    struct io_uring_buf_reg reg;
    memset(&reg, 0, sizeof(reg));
    reg.ring_addr = (uint64_t)(uintptr_t)br;
    reg.ring_entries = entries;
    reg.bgid = BGID;
    reg.pad = inc ? IOU_PBUF_RING_INC : 0; /* the kernel's io_uring_buf_reg.flags */
    int r = io_uring_register_buf_ring(ring, &reg, 0);
    if (r < 0) {
        snprintf(why, whylen, "IORING_REGISTER_PBUF_RING%s: %s", inc ? " with IOU_PBUF_RING_INC" : "", strerror(-r));
        munmap(mem, len);
        return -1;
    }
    *out = br;
    *bytes = len;
    return 0;
}

/* Probe: does the kernel take the variant at all? (A refusal is reported, not fatal.) */
int probe(int variant, char *why, size_t whylen)
{
    int kind = V_KIND(variant);
    struct io_uring ring;
    struct io_uring_buf_ring *br = NULL;
    size_t br_bytes = 0;
    static char buf[64]; /* outlives the ring's asynchronous teardown */
    int sv[2] = { -1, -1 }, ok = -1;

    if (ring_setup(&ring, drain_of(variant) == DRAIN_FLAG, why, whylen) != 0)
        return -1;
    if (kind != V_POLL && bufring_register(&ring, 8, kind == V_BUFRING_INC, &br, &br_bytes, why, whylen) != 0)
        goto out;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(why, whylen, "socketpair: %s", strerror(errno));
        goto out;
    }
    if (br != NULL) {
        io_uring_buf_ring_add(br, buf, sizeof(buf), 0, io_uring_buf_ring_mask(8), 0);
        io_uring_buf_ring_advance(br, 1);
    }
    if (write(sv[1], "ping", 4) != 4) {
        snprintf(why, whylen, "socketpair write: %s", strerror(errno));
        goto out;
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    if (kind == V_POLL) {
        io_uring_prep_poll_multishot(sqe, sv[0], POLLIN | POLLOUT | POLLRDHUP);
    } else {
        io_uring_prep_recv_multishot(sqe, sv[0], NULL, 0, 0);
        sqe->flags |= IOSQE_BUFFER_SELECT;
        sqe->buf_group = BGID;
    }
    io_uring_sqe_set_data64(sqe, 1);
    struct io_uring_cqe *cqe;
    struct __kernel_timespec ts = { .tv_sec = 2 };
    int r = io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &ts, NULL);
    if (r < 0) {
        snprintf(why, whylen, "no completion for the probe: %s", strerror(-r));
        goto out;
    }
    if (cqe->res < 0)
        snprintf(why, whylen, "%s: %s", kind == V_POLL ? "multishot POLL_ADD" : "multishot RECV", strerror(-cqe->res));
    else if (!(cqe->flags & IORING_CQE_F_MORE))
        snprintf(why, whylen, "the kernel did not keep the request multishot (flags 0x%x)", cqe->flags);
    else if (kind != V_POLL && (cqe->res != 4 || !(cqe->flags & IORING_CQE_F_BUFFER) || memcmp(buf, "ping", 4) != 0))
        snprintf(why, whylen, "the provided buffer did not receive the probe's bytes");
    else if (kind == V_BUFRING_INC && !(cqe->flags & IORING_CQE_F_BUF_MORE))
        snprintf(why, whylen, "incremental consumption not in effect (no IORING_CQE_F_BUF_MORE on a partly used buffer)");
    else
        ok = 0;
    io_uring_cqe_seen(&ring, cqe);
out:
    io_uring_unregister_ring_fd(&ring);
    io_uring_queue_exit(&ring); /* cancels the multishot request */
    if (sv[0] >= 0) {
        close(sv[0]);
        close(sv[1]);
    }
    if (br != NULL)
        munmap(br, br_bytes);
    return ok;
}

/* Probe for --drain: PROBE_SOCKETS multishot polls on a ring with TASKRUN_FLAG, one byte written
 * to each, then enters until one surfaces nothing. The flag works if it is set whenever work is
 * left (before each enter that surfaces CQEs), clear once none is, and every wake-up arrives. */
#define PROBE_SOCKETS 64
int probe_drain(char *evidence, size_t len)
{
    struct io_uring ring;
    char why[200];
    if (ring_setup(&ring, 1, why, sizeof(why)) != 0) {
        snprintf(evidence, len, "the kernel refuses TASKRUN_FLAG with DEFER_TASKRUN: %s", why);
        return DRAIN_COUNT;
    }
    int sv[PROBE_SOCKETS][2], nsv = 0, result = DRAIN_FLAG;
    unsigned total = 0;
    size_t at = (size_t)snprintf(evidence, len, "TASKRUN_FLAG|DEFER_TASKRUN accepted; %d poll wake-ups:",
                                 PROBE_SOCKETS);
    for (; nsv < PROBE_SOCKETS; nsv++) {
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv[nsv]) != 0)
            die("socketpair: %s", strerror(errno));
        struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
        io_uring_prep_poll_multishot(sqe, sv[nsv][0], POLLIN);
        io_uring_sqe_set_data64(sqe, (uint64_t)nsv);
    }
    if (io_uring_submit(&ring) != PROBE_SOCKETS)
        die("probe_drain: the polls were not all submitted");
    for (int i = 0; i < PROBE_SOCKETS; i++)
        if (write(sv[i][1], "x", 1) != 1)
            die("probe_drain: socketpair write: %s", strerror(errno));
    for (int e = 0; e < PROBE_SOCKETS + 2; e++) {
        int flag = (IO_URING_READ_ONCE(*ring.sq.kflags) & IORING_SQ_TASKRUN) != 0;
        int r = e == 0 ? io_uring_submit_and_wait(&ring, 1) : io_uring_get_events(&ring);
        if (r < 0 && r != -EINTR && r != -EAGAIN)
            die("probe_drain: io_uring_enter: %s", strerror(-r));
        unsigned got = io_uring_cq_ready(&ring);
        io_uring_cq_advance(&ring, got);
        total += got;
        if (at < len)
            at += (size_t)snprintf(evidence + at, len - at, " %s+%u", flag ? "[flag]" : "[no flag]", got);
        if (got > 0 && !flag)
            result = DRAIN_COUNT; /* work was left, the flag did not say so */
        if (got == 0) {
            if (flag)
                result = DRAIN_COUNT; /* the flag said work was left, there was none */
            break;
        }
    }
    if (total != PROBE_SOCKETS)
        result = DRAIN_COUNT;
    if (at < len)
        snprintf(evidence + at, len - at, " CQEs per enter");
    io_uring_unregister_ring_fd(&ring);
    io_uring_queue_exit(&ring);
    for (int i = 0; i < nsv; i++) {
        close(sv[i][0]);
        close(sv[i][1]);
    }
    return result;
}
