/* main.c - options, probing, the interleaved rounds, medians and paired ratios. */

#include "ringrecv.h"

const char *const variant_names[V_COUNT] = { "poll-batch", "bufring", "bufring-inc",
                                              "poll-batch+drain", "bufring+drain", "bufring-inc+drain" };
const char *const drain_names[3] = { "off", "flag", "count" };

struct options opt = {
    .conns = 256, .depth = 16, .rounds = 5, .seconds = 4, .warmup = 1,
    .buf_size = 4096, .bufs = 1024,
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ringrecv [--conns N] [--depth D] [--seconds M] [--warmup W] [--rounds R]\n"
            "                [--variants poll-batch,bufring,bufring-inc] [--buf-size B] [--bufs N]\n"
            "                [--check] [--sndbuf BYTES] [--verbose] [--drain] [--drain-by flag|count]\n"
            "  --conns     connections (default 256)\n"
            "  --depth     pipelined requests per connection per batch (default 16)\n"
            "  --seconds   measured seconds per run (default 4)\n"
            "  --warmup    warm-up seconds per run (default 1)\n"
            "  --rounds    rounds; each runs every variant, in rotating order (default 5)\n"
            "  --variants  which variants, comma separated; the ratios' base is poll-batch if given, else\n"
            "              the first; NAME+drain is NAME with drain (e.g. poll-batch,poll-batch+drain)\n"
            "  --buf-size  bytes per ring buffer and per connection read (default 4096)\n"
            "  --bufs      buffer ring entries, a power of two <= 32768 (default 1024)\n"
            "  --check     the server also compares every request byte (costs CPU; off by default)\n"
            "  --sndbuf    server sockets' SO_SNDBUF (exercises short sends)\n"
            "  --verbose   lifetime counters per run on stderr\n"
            "  --drain     every variant given runs with drain: after each wait, io_uring_get_events\n"
            "              while deferred task work is left (at most 16 more enters per pass)\n"
            "  --drain-by  how drain tells work is left: flag (IORING_SQ_TASKRUN, ring set up with\n"
            "              TASKRUN_FLAG) or count (the enter surfaced 20 CQEs); default: probed\n");
}

static int variant_by_name(const char *name, size_t len)
{
    for (int v = 0; v < V_COUNT; v++)
        if (strlen(variant_names[v]) == len && strncmp(variant_names[v], name, len) == 0)
            return v;
    return -1;
}

static void parse_args(int argc, char **argv)
{
    int have_variants = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV()                                                                                            \
    do {                                                                                                   \
        if (v == NULL)                                                                                     \
            die("%s needs a value", a);                                                                    \
        i++;                                                                                               \
    } while (0)
        if (!strcmp(a, "--conns")) {
            NEEDV();
            opt.conns = atoi(v);
        } else if (!strcmp(a, "--depth")) {
            NEEDV();
            opt.depth = atoi(v);
        } else if (!strcmp(a, "--seconds")) {
            NEEDV();
            opt.seconds = atof(v);
        } else if (!strcmp(a, "--warmup")) {
            NEEDV();
            opt.warmup = atof(v);
        } else if (!strcmp(a, "--rounds")) {
            NEEDV();
            opt.rounds = atoi(v);
        } else if (!strcmp(a, "--buf-size")) {
            NEEDV();
            opt.buf_size = (size_t)atol(v);
        } else if (!strcmp(a, "--bufs")) {
            NEEDV();
            opt.bufs = (unsigned)atol(v);
        } else if (!strcmp(a, "--sndbuf")) {
            NEEDV();
            opt.sndbuf = atoi(v);
        } else if (!strcmp(a, "--check")) {
            opt.check = 1;
        } else if (!strcmp(a, "--verbose")) {
            opt.verbose = 1;
        } else if (!strcmp(a, "--drain")) {
            opt.drain = 1;
        } else if (!strcmp(a, "--drain-by")) {
            NEEDV();
            if (!strcmp(v, "flag"))
                opt.drain_by = DRAIN_FLAG;
            else if (!strcmp(v, "count"))
                opt.drain_by = DRAIN_COUNT;
            else
                die("--drain-by takes flag or count");
        } else if (!strcmp(a, "--variants")) {
            NEEDV();
            have_variants = 1;
            opt.nvariants = 0;
            const char *p = v;
            while (*p) {
                const char *e = strchr(p, ',');
                size_t len = e ? (size_t)(e - p) : strlen(p);
                int id = variant_by_name(p, len);
                if (id < 0)
                    die("unknown variant '%.*s' (poll-batch, bufring, bufring-inc, each also as NAME+drain)",
                        (int)len, p);
                if (opt.nvariants == V_COUNT)
                    die("more than %d variants", V_COUNT);
                opt.variants[opt.nvariants++] = id;
                p += len;
                if (*p == ',')
                    p++;
            }
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else {
            usage(stderr);
            die("unknown option %s", a);
        }
#undef NEEDV
    }
    if (!have_variants) {
        opt.nvariants = V_KINDS;
        for (int v = 0; v < V_KINDS; v++)
            opt.variants[v] = v;
    }
    for (int k = 0; k < opt.nvariants; k++) {
        if (opt.drain)
            opt.variants[k] = V_KIND(opt.variants[k]) + V_KINDS;
        for (int j = 0; j < k; j++)
            if (opt.variants[j] == opt.variants[k])
                die("variant %s given twice%s", variant_names[opt.variants[k]], opt.drain ? " (with --drain)" : "");
    }
    if (opt.conns < 1 || opt.conns > 65536)
        die("--conns must be 1..65536");
    if (opt.depth < 1 || opt.depth > 4096)
        die("--depth must be 1..4096");
    if (opt.seconds <= 0 || opt.warmup < 0)
        die("--seconds must be > 0 and --warmup >= 0");
    if (opt.rounds < 1)
        die("--rounds must be >= 1");
    if (opt.buf_size < 64 || opt.buf_size > (1u << 20))
        die("--buf-size must be 64..1048576");
    if (opt.bufs < 1 || opt.bufs > 32768 || (opt.bufs & (opt.bufs - 1)) != 0)
        die("--bufs must be a power of two, 1..32768");
    if (opt.nvariants < 1)
        die("no variants");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    if (n == 0)
        return 0;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)opt.conns * 2 + 64)
        die("%d connections need %d descriptors; RLIMIT_NOFILE is %llu", opt.conns, opt.conns * 2 + 64,
            (unsigned long long)rl.rlim_cur);
}

/* v's requests/s and CPU per request over base's, per round and their medians (a, b: scratch). */
static void print_ratios(const struct result *results, int v, int base, double *a, double *b)
{
    int n = 0;
    printf("%s/%s per round:", variant_names[v], variant_names[base]);
    for (int r = 0; r < opt.rounds; r++) {
        const struct result *x = &results[r * V_COUNT + v], *y = &results[r * V_COUNT + base];
        if (!x->valid || !y->valid)
            continue;
        a[n] = x->rps / y->rps;
        b[n] = x->cpu_us / y->cpu_us;
        printf("  r%d req/s %.3f cpu/req %.3f", r + 1, a[n], b[n]);
        n++;
    }
    if (n == 0)
        printf("  (no pairs)\n");
    else {
        double mb = median(b, n);
        printf("\n  median ratio: req/s %.3f  cpu us/req %.3f\n", median(a, n), mb);
    }
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    raise_nofile();
    setvbuf(stdout, NULL, _IOLBF, 0);
    wire_init();

    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&listen_addr, 0, sizeof(listen_addr));
    listen_addr.sin_family = AF_INET;
    listen_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof(listen_addr);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&listen_addr, sizeof(listen_addr)) != 0
        || listen(listen_fd, 4096) != 0 || getsockname(listen_fd, (struct sockaddr *)&listen_addr, &alen) != 0)
        die("listener: %s", strerror(errno));

    printf("ringrecv: conns %d, depth %d, request %zu B, response %zu B, buf-size %zu, bufs %u, "
           "warmup %.2f s, measured %.2f s, rounds %d, server CPU %d, load CPU %d%s\n",
           opt.conns, opt.depth, REQ_LEN, RESP_LEN, opt.buf_size, opt.bufs, opt.warmup, opt.seconds, opt.rounds,
           SERVER_CPU, CLIENT_CPU, opt.check ? ", --check" : "");

    int any_drain = 0;
    for (int k = 0; k < opt.nvariants; k++)
        any_drain |= V_DRAINS(opt.variants[k]);
    if (any_drain) {
        char evidence[512];
        int probed = probe_drain(evidence, sizeof(evidence));
        int forced = opt.drain_by != DRAIN_OFF;
        if (!forced)
            opt.drain_by = probed;
        printf("drain by %s%s: at most %d io_uring_get_events after each wait while %s (probe: %s; %s)\n",
               drain_names[opt.drain_by], forced ? " (--drain-by)" : "", DRAIN_MAX_EXTRA,
               opt.drain_by == DRAIN_FLAG ? "IORING_SQ_TASKRUN is set" : "the last enter surfaced >= 20 CQEs",
               evidence, probed == DRAIN_FLAG ? "the flag tracks the work left" : "the flag does not track it");
    }

    for (int k = 0; k < opt.nvariants; k++) {
        int v = opt.variants[k];
        if (probe(v, skip_why[v], sizeof(skip_why[v])) != 0) {
            skipped[v] = 1;
            printf("variant %s skipped: %s\n", variant_names[v], skip_why[v]);
        }
    }

    int nv = opt.nvariants;
    struct result *results = calloc((size_t)opt.rounds * V_COUNT, sizeof(struct result));
    for (int r = 0; r < opt.rounds; r++) {
        for (int k = 0; k < nv; k++) {
            int v = opt.variants[(r + k) % nv];
            if (skipped[v])
                continue;
            struct result res = run_one(v);
            if (!res.valid)
                continue;
            results[r * V_COUNT + v] = res;
            printf("round %d %-17s %10.0f req/s  %6.3f us/req  %6.4f enters/req  %6.3f cqes/req  %8.0f passes/s  "
                   "%5.1f recvs/pass  %5.1f cqes/wait  %5.1f%% waits>=20  %5.2f drains/pass  ENOBUFS %llu  "
                   "ms-ended %llu  short-sends %llu  send-EAGAIN %llu  recv-EAGAIN %llu  (%.2f s)\n",
                   r + 1, variant_names[v], res.rps, res.cpu_us, res.enters, res.cqes, res.passes_per_s,
                   (double)res.recv_cqes / (res.passes_per_s * res.wall), res.cqes_per_wait, res.capped_share * 100,
                   res.drains_per_pass, (unsigned long long)res.enobufs, (unsigned long long)res.ms_ended,
                   (unsigned long long)res.short_sends, (unsigned long long)res.eagain_sends,
                   (unsigned long long)res.recv_eagain, res.wall);
        }
    }

    printf("\nsummary (medians over %d rounds)\n", opt.rounds);
    double *a = calloc((size_t)opt.rounds, sizeof(double));
    double *b = calloc((size_t)opt.rounds, sizeof(double));
    double *c = calloc((size_t)opt.rounds, sizeof(double));
    double *d = calloc((size_t)opt.rounds, sizeof(double));
    int base = opt.variants[0]; /* ratios are to poll-batch when it runs, else to the first variant */
    int present[V_COUNT] = { 0 };
    for (int k = 0; k < nv; k++) {
        int v = opt.variants[k];
        present[v] = 1;
        if (v == V_POLL)
            base = V_POLL;
        int n = 0;
        for (int r = 0; r < opt.rounds; r++) {
            struct result *x = &results[r * V_COUNT + v];
            if (!x->valid)
                continue;
            a[n] = x->rps;
            b[n] = x->cpu_us;
            c[n] = x->enters;
            d[n] = x->cqes_per_wait;
            n++;
        }
        if (n == 0) {
            printf("%-17s no valid runs%s%s\n", variant_names[v], skipped[v] ? ": " : "", skipped[v] ? skip_why[v] : "");
            continue;
        }
        printf("%-17s median %10.0f req/s  %6.3f us/req  %6.4f enters/req  %5.1f cqes/wait  (%d runs)\n",
               variant_names[v], median(a, n), median(b, n), median(c, n), median(d, n), n);
    }
    /* Each variant to the base; each +drain variant also to itself without drain. */
    for (int k = 0; k < nv; k++) {
        int v = opt.variants[k];
        if (v != base)
            print_ratios(results, v, base, a, b);
        if (V_DRAINS(v) && present[V_KIND(v)] && V_KIND(v) != base)
            print_ratios(results, v, V_KIND(v), a, b);
    }
    free(a);
    free(b);
    free(c);
    free(d);
    free(results);
    close(listen_fd);
    return 0;
}
