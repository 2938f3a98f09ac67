/*
 * ktl_sync.h - one op done synchronously (readv, or sendmsg with MSG_NOSIGNAL), and the
 * check every op passes before the kernel sees it. Used by the engine's synchronous
 * path and by the AIO path for the ops it cannot or did not submit. Not exported.
 */
#ifndef KTL_SYNC_H
#define KTL_SYNC_H

#include <stdint.h>

#include "ktl.h"

/* 1 when the op may be handed to the kernel in this direction, 0 otherwise. */
int ktl_op_is_valid(int32_t direction, const ktl_op *op);

/* Performs the op with one readv or sendmsg, retrying EINTR; stores bytes or -errno. */
void ktl_sync_op(int32_t direction, ktl_op *op);

#endif /* KTL_SYNC_H */
