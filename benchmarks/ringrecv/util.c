/* util.c - fatal errors, clocks, CPU pinning, the wire content, the run phase. */

#include "ringrecv.h"

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ringrecv: FATAL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

double now_s(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void pin(int cpu, const char *who)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        fprintf(stderr, "ringrecv: warning: cannot pin the %s to CPU %d: %s\n", who, cpu, strerror(errno));
}

void sleep_s(double sec)
{
    if (sec <= 0)
        return;
    struct timespec ts = { .tv_sec = (time_t)sec, .tv_nsec = (long)((sec - (double)(time_t)sec) * 1e9) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

char *resp_pattern;
size_t resp_send_cap;
char *req_pattern;

void wire_init(void)
{
    resp_pattern = malloc(RESP_LEN * (RESP_REPEAT + 1));
    for (int i = 0; i <= RESP_REPEAT; i++)
        memcpy(resp_pattern + (size_t)i * RESP_LEN, RESPONSE_TEXT, RESP_LEN);
    resp_send_cap = RESP_LEN * RESP_REPEAT;
    if (RESP_LEN * RESP_REPEAT < CLIENT_READ)
        die("response pattern shorter than a client read");
    size_t req_copies = opt.buf_size / REQ_LEN + 2;
    req_pattern = malloc(REQ_LEN * req_copies);
    for (size_t i = 0; i < req_copies; i++)
        memcpy(req_pattern + i * REQ_LEN, REQUEST_TEXT, REQ_LEN);
}

_Atomic int phase;
_Atomic int client_done;
