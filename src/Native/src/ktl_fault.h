/*
 * ktl_fault.h - fault injection for the C tests (not exported, not in the ABI).
 *
 * The test suite ring_faults links a build of the engine with KTL_FAULT_INJECTION defined
 * (the static library ktl_native_faults), in which chosen calls fail on demand: the paths
 * that run only when the kernel or the allocator refuses can then be made to run. In
 * libktl_native.so KTL_FAULT(site) is the constant 0, so every site compiles away.
 */
#ifndef KTL_FAULT_H
#define KTL_FAULT_H

typedef enum ktl_fault_site {
    KTL_FAULT_SQE,   /* ktl_ring_sqe finds no SQE: the submission queue is full and flushing it failed */
    KTL_FAULT_ENTER, /* an io_uring_enter of a batch or a removal fails before reaching the kernel */
    KTL_FAULT_KEEP,  /* keeping a completion for the next wait finds no memory */
    KTL_FAULT_SITES
} ktl_fault_site;

#ifdef KTL_FAULT_INJECTION
/* After `skip` more calls at `site` that pass, the next `count` fail with -error. */
void ktl_fault_arm(ktl_fault_site site, int skip, int count, int error);
/* How many calls at `site` failed since it was last armed. */
int ktl_fault_fired(ktl_fault_site site);
/* 0, or the -errno the call at `site` fails with. */
int ktl_fault(ktl_fault_site site);
#define KTL_FAULT(site) ktl_fault(site)
#else
#define KTL_FAULT(site) 0
#endif

#endif /* KTL_FAULT_H */
