/*
 * ktl_uring_none.c - the io_uring entry points of a build without liburing (CMake found no
 * liburing.a): the ABI stays whole, ktl_ring_supported answers 0 and ktl_ring_create ENOSYS,
 * and the managed side runs on epoll (or, asked for io_uring explicitly, says why it cannot).
 */
#include <errno.h>
#include <stddef.h>

#include "ktl.h"

KTL_EXPORT int32_t ktl_ring_supported(void)
{
    return 0;
}

KTL_EXPORT ktl_ring *ktl_ring_create(int32_t entries, uint32_t flags, ktl_ring_info *info, int32_t *error)
{
    (void)entries;
    (void)flags;
    (void)info;
    if (error != NULL)
        *error = ENOSYS;
    return NULL;
}

KTL_EXPORT int32_t ktl_ring_start(ktl_ring *ring, int32_t wake_fd, ktl_ring_info *info)
{
    (void)ring;
    (void)wake_fd;
    (void)info;
    return -ENOSYS;
}

KTL_EXPORT int32_t ktl_ring_poll(ktl_ring *ring, int32_t fd, uint32_t events, uint64_t user_data)
{
    (void)ring;
    (void)fd;
    (void)events;
    (void)user_data;
    return -ENOSYS;
}

KTL_EXPORT int32_t ktl_ring_accept(ktl_ring *ring, int32_t fd, uint64_t user_data)
{
    (void)ring;
    (void)fd;
    (void)user_data;
    return -ENOSYS;
}

KTL_EXPORT int32_t ktl_ring_remove(ktl_ring *ring, uint64_t user_data, int32_t wait)
{
    (void)ring;
    (void)user_data;
    (void)wait;
    return -ENOSYS;
}

KTL_EXPORT int32_t ktl_ring_remove_all(ktl_ring *ring, const uint64_t *user_data, int32_t count)
{
    (void)ring;
    (void)user_data;
    (void)count;
    return -ENOSYS;
}

KTL_EXPORT int32_t ktl_ring_wait(ktl_ring *ring, int32_t timeout_ms, ktl_cqe *out, int32_t capacity)
{
    (void)ring;
    (void)timeout_ms;
    (void)out;
    (void)capacity;
    return -ENOSYS;
}

KTL_EXPORT int32_t ktl_ring_batch(ktl_ring *ring, int32_t direction, ktl_op *ops, int32_t count)
{
    (void)ring;
    (void)direction;
    (void)ops;
    (void)count;
    return -ENOSYS;
}

KTL_EXPORT void ktl_ring_destroy(ktl_ring *ring)
{
    (void)ring;
}
