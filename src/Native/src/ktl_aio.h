/*
 * ktl_aio.h - private interface between the engine (ktl_engine.c) and its Linux AIO
 * facility (ktl_aio.c). Nothing here is exported from libktl_native.so.
 */
#ifndef KTL_AIO_H
#define KTL_AIO_H

#include <linux/aio_abi.h>
#include <stdint.h>

#include "ktl.h"

typedef struct ktl_aio {
    aio_context_t ctx;          /* 0 = no context */
    int32_t capacity;           /* what io_setup was asked for; the most we keep in flight */
    int32_t use_ring;           /* 0 forces io_getevents (ring unusable, or KTL_AIO_DISABLE_RING) */
    int32_t under_valgrind;     /* set at open; see ktl_aio.c */

    /* Scratch for one chunk, grown on demand up to capacity, so a batch never allocates
     * once the engine has seen its largest chunk, and a big batch can never overrun it. */
    int32_t scratch_len;
    struct iocb *iocbs;
    struct iocb **iocb_ptrs;
    struct io_event *events;
} ktl_aio;

/* Returns 0, or the positive errno of io_setup; on failure aio->ctx stays 0. */
int ktl_aio_open(ktl_aio *aio, int32_t capacity);

/* io_destroy plus scratch release; safe on a never-opened or failed ktl_aio. */
void ktl_aio_close(ktl_aio *aio);

/* Requires aio->ctx != 0. Stores a result in every op, like ktl_batch. */
void ktl_aio_batch(ktl_aio *aio, int32_t direction, ktl_op *ops, int32_t count);

#endif /* KTL_AIO_H */
