/*
 * ktl_engine.c - engine lifetime, the ABI version and ktl_batch dispatch: a batch goes
 * to the AIO facility (ktl_aio.c) or op by op to the synchronous path (ktl_sync.c).
 *
 * An engine belongs to one event-loop thread; nothing here is thread-safe, which is
 * what lets the scratch arrays and the AIO context be used without locks.
 */
#include <errno.h>
#include <stdlib.h>

#include "ktl.h"
#include "ktl_aio.h"
#include "ktl_sync.h"

struct ktl_engine {
    ktl_aio aio;
};

KTL_EXPORT int32_t ktl_abi_version(void)
{
    return KTL_ABI_VERSION;
}

KTL_EXPORT ktl_engine *ktl_engine_create(int32_t aio_capacity, int32_t *aio_error)
{
    int err = 0;
    ktl_engine *engine = calloc(1, sizeof(*engine));
    if (engine == NULL) {
        if (aio_error != NULL)
            *aio_error = ENOMEM;
        return NULL;
    }

    if (aio_capacity < 0)
        err = EINVAL;
    else if (aio_capacity > 0)
        err = ktl_aio_open(&engine->aio, aio_capacity);

    if (aio_error != NULL)
        *aio_error = err;
    return engine;
}

KTL_EXPORT int32_t ktl_engine_has_aio(const ktl_engine *engine)
{
    return engine != NULL && engine->aio.ctx != 0;
}

KTL_EXPORT void ktl_engine_destroy(ktl_engine *engine)
{
    if (engine == NULL)
        return;
    ktl_aio_close(&engine->aio);
    free(engine);
}

KTL_EXPORT int32_t ktl_batch(ktl_engine *engine, int32_t direction, int32_t use_aio,
                             ktl_op *ops, int32_t count)
{
    if (engine == NULL || ops == NULL || count < 0)
        return -EINVAL;
    if (direction != KTL_OP_RECEIVE && direction != KTL_OP_SEND)
        return -EINVAL;

    if (use_aio && engine->aio.ctx != 0) {
        ktl_aio_batch(&engine->aio, direction, ops, count);
    } else {
        for (int32_t i = 0; i < count; i++)
            ktl_sync_op(direction, &ops[i]);
    }
    return count;
}
