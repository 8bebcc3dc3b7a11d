/* Preloaded before libfaketime by tests/lib/faketime.py: sleeps on any clock but the wall clock go
 * straight to the C library.
 *
 * Debian 12's libfaketime (0.9.10) rewrites every absolute clock_nanosleep() deadline as if it
 * were a wall-clock time, even with FAKETIME_DONT_FAKE_MONOTONIC=1: a deadline on CLOCK_MONOTONIC
 * (CPython 3.11's time.sleep) comes out negative and the call fails with EINVAL, or lands in the
 * past and returns at once (wolfcw/libfaketime issue #426, fixed upstream in 0.9.11). A monotonic
 * deadline needs no translation at all, so it goes to glibc's own clock_nanosleep. Wall-clock
 * deadlines still go to libfaketime, which moves them by the offset in force at the call.
 *
 * glibc is looked up by name: dlsym(RTLD_NEXT) from here would find libfaketime, which is loaded
 * after this library.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <time.h>

typedef int (*clock_nanosleep_fn)(clockid_t, int, const struct timespec *, struct timespec *);

static clock_nanosleep_fn glibc_clock_nanosleep;
static clock_nanosleep_fn faked_clock_nanosleep;

static void resolve(void)
{
    void *glibc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    if (glibc != NULL)
        glibc_clock_nanosleep = (clock_nanosleep_fn)dlsym(glibc, "clock_nanosleep");
    faked_clock_nanosleep = (clock_nanosleep_fn)dlsym(RTLD_NEXT, "clock_nanosleep");
}

__attribute__((constructor)) static void init(void)
{
    resolve();
}

int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *req, struct timespec *rem)
{
    if (glibc_clock_nanosleep == NULL)
        resolve();
    if (clock_id == CLOCK_REALTIME && faked_clock_nanosleep != NULL)
        return faked_clock_nanosleep(clock_id, flags, req, rem);
    if (glibc_clock_nanosleep == NULL)
        return ENOSYS; /* loud (time.sleep raises) rather than a sleep of the wrong length */
    return glibc_clock_nanosleep(clock_id, flags, req, rem);
}
