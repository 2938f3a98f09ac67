/*
 * ktl_fault.c - the fault switches of ktl_fault.h; compiled into the tests' build of the
 * engine only (ktl_native_faults), never into libktl_native.so. The tests are single-threaded.
 */
#include "ktl_fault.h"

static struct {
    int skip;
    int count;
    int error;
    int fired;
} faults[KTL_FAULT_SITES];

void ktl_fault_arm(ktl_fault_site site, int skip, int count, int error)
{
    faults[site].skip = skip;
    faults[site].count = count;
    faults[site].error = error;
    faults[site].fired = 0;
}

int ktl_fault_fired(ktl_fault_site site)
{
    return faults[site].fired;
}

int ktl_fault(ktl_fault_site site)
{
    if (faults[site].count == 0)
        return 0;
    if (faults[site].skip > 0) {
        faults[site].skip--;
        return 0;
    }
    faults[site].count--;
    faults[site].fired++;
    return -faults[site].error;
}
