using System.Diagnostics.Metrics;
using System.Net;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Loop;

namespace Kestrel.Transport.Linux.Diagnostics;

/// <summary>
/// The transport's meter, <c>Kestrel.Transport.Linux</c>. Totals that change every pass (passes,
/// bytes) are plain fields on each loop, read by observable instruments only when someone collects,
/// so an unobserved meter costs the loop nothing; per-pass histograms record only while a listener
/// has enabled them.
/// </summary>
internal sealed class TransportMetrics : IDisposable
{
    public const string MeterName = "Kestrel.Transport.Linux";

    private readonly Meter _meter;
    private readonly Lock _gate = new();
    private readonly List<EventLoop> _loops = [];
    private readonly List<LoopThreads> _threads = [];

    public TransportMetrics(IMeterFactory? meterFactory)
    {
        _meter = meterFactory?.Create(MeterName) ?? new Meter(MeterName);

        CurrentConnections = _meter.CreateUpDownCounter<long>(
            "kestrel.transport.linux.connections.current", "{connection}", "Connections open on the transport's loops.");
        TotalConnections = _meter.CreateCounter<long>(
            "kestrel.transport.linux.connections.accepted", "{connection}", "Connections accepted since start.");
        AcceptErrors = _meter.CreateCounter<long>(
            "kestrel.transport.linux.accept.errors", "{error}", "Failed accept4 calls, tagged with the errno name; the listener backs off and retries.");
        AioFallbacks = _meter.CreateCounter<long>(
            "kestrel.transport.linux.aio.fallbacks", "{loop}", "Loops that asked for Linux AIO and fell back to Epoll (readv and sendmsg).");
        IoUringFallbacks = _meter.CreateCounter<long>(
            "kestrel.transport.linux.io_uring.fallbacks", "{loop}", "Loops that IoBackend=Auto (or a failed ring) ran on epoll because io_uring was unavailable.");
        EventsPerPass = _meter.CreateHistogram<int>(
            "kestrel.transport.linux.pass.events", "{event}", "Readiness events (epoll or io_uring poll completions) handled by one loop pass.");
        BytesPerPass = _meter.CreateHistogram<long>(
            "kestrel.transport.linux.pass.bytes", "By", "Bytes received or sent by one loop pass's batch, tagged network.io.direction (receive, transmit).");
        ZeroCopySends = _meter.CreateCounter<long>(
            "kestrel.transport.linux.zerocopy.sends", "{send}", "Sends made with MSG_ZEROCOPY (ZeroCopySendThreshold).");
        ZeroCopyCompletions = _meter.CreateCounter<long>(
            "kestrel.transport.linux.zerocopy.completions", "{send}", "MSG_ZEROCOPY sends the kernel reported done, tagged kestrel.transport.linux.zerocopy.copied=true when it copied the data after all (always over loopback).");
        ZeroCopyRefusals = _meter.CreateCounter<long>(
            "kestrel.transport.linux.zerocopy.refused", "{send}", "Zero-copy sends the kernel refused (ENOBUFS: the socket's optmem limit; ENOMEM: the locked-memory limit; EOPNOTSUPP); each went out again as a copying send.");
        LoopHandoffs = _meter.CreateCounter<long>(
            "kestrel.transport.linux.loop.handoffs", "{handoff}", "Times a loop was moved to another thread because an application continuation held its thread too long (Adaptive scheduling), tagged with the loop, kestrel.transport.linux.handoff.reason (blocked: asleep in a blocking call; computing) and the connection's local endpoint (server.address, server.port).");
        LoopHandoffsRefused = _meter.CreateCounter<long>(
            "kestrel.transport.linux.loop.handoffs.refused", "{handoff}", "Application continuations that held a loop's thread long enough to move the loop, but no thread could take it (Adaptive scheduling): error.type thread_limit (the loops' threads are at their ceiling) or thread_start_failed (Thread.Start threw: pids.max, RLIMIT_NPROC, memory). The loop waits for the continuation to return. Tagged with the loop.");
        Demotions = _meter.CreateCounter<long>(
            "kestrel.transport.linux.connection.demotions", "{connection}", "Connections moved to the thread pool for a while because application code blocked or computed on their loop (Adaptive scheduling), tagged kestrel.transport.linux.handoff.reason (blocked, computing) and with the local endpoint (server.address, server.port).");
        Spills = _meter.CreateCounter<long>(
            "kestrel.transport.linux.loop.spills", "{continuation}", "Application continuations a loop gave to a thread of its own to run, instead of running them itself, during a storm of blocking ones (three hand-offs of blocked threads within 50 ms, Adaptive scheduling), tagged with the loop.");
        ConnectionsStartedOnPool = _meter.CreateCounter<long>(
            "kestrel.transport.linux.connections.started_on_pool", "{connection}", "New connections that start on the thread pool because their loop was handed off eight times within a second (Adaptive scheduling), tagged with the loop.");
        LongPasses = _meter.CreateCounter<long>(
            "kestrel.transport.linux.loop.long_passes", "{pass}", "Loop passes that took over 50 ms: something held the loop's thread (with Inline scheduling, application code that blocked), tagged with the loop.");
        SendQueueLength = _meter.CreateHistogram<int>(
            "kestrel.transport.linux.send.queue_length", "{connection}", "Connections whose deferred sends one pass coalesced into its send batch.");

        _meter.CreateObservableCounter("kestrel.transport.linux.loop.passes", () => Sum(static l => l.PassCount), "{pass}", "Event-loop passes (epoll_wait returns) since start.");
        _meter.CreateObservableCounter("kestrel.transport.linux.bytes", ObserveBytes, "By", "Bytes received and sent, tagged network.io.direction (receive, transmit).");
        _meter.CreateObservableUpDownCounter("kestrel.transport.linux.loop.threads", () => SumThreads(static t => t.Count), "{thread}", "Threads that hold the loops, finish application code a loop was taken from, or wait to take one over (Adaptive scheduling).");
        _meter.CreateObservableUpDownCounter("kestrel.transport.linux.loop.standbys", () => SumThreads(static t => t.Waiting), "{thread}", "Threads waiting to take over a loop (Adaptive scheduling); on io_uring they stay until the server stops.");
        _meter.CreateObservableGauge("kestrel.transport.linux.loop.current_pass.duration", ObservePasses, "s", "How long each loop has been inside its current pass (0 while it waits for events), tagged with the loop: a loop stuck in application code shows here while it is stuck.");
    }

    public UpDownCounter<long> CurrentConnections { get; }

    public Counter<long> TotalConnections { get; }

    public Counter<long> AcceptErrors { get; }

    public Counter<long> AioFallbacks { get; }

    public Counter<long> IoUringFallbacks { get; }

    public Histogram<int> EventsPerPass { get; }

    public Histogram<long> BytesPerPass { get; }

    public Histogram<int> SendQueueLength { get; }

    public Counter<long> ZeroCopySends { get; }

    public Counter<long> LoopHandoffs { get; }

    public Counter<long> LongPasses { get; }

    public Counter<long> LoopHandoffsRefused { get; }

    public Counter<long> Demotions { get; }

    public Counter<long> ConnectionsStartedOnPool { get; }

    public Counter<long> Spills { get; }

    /// <summary>The tag that names a loop (its index).</summary>
    public const string LoopTag = "kestrel.transport.linux.loop";

    public Counter<long> ZeroCopyCompletions { get; }

    public Counter<long> ZeroCopyRefusals { get; }

    // Attribute names as OpenTelemetry's semantic conventions spell them (network.io.direction: receive, transmit;
    // error.type), like Kestrel's own kestrel.* instruments; the transport's own attribute carries its namespace.
    public static readonly KeyValuePair<string, object?> Copied = new("kestrel.transport.linux.zerocopy.copied", true);

    public static readonly KeyValuePair<string, object?> NotCopied = new("kestrel.transport.linux.zerocopy.copied", false);

    public static readonly KeyValuePair<string, object?> Received = new("network.io.direction", "receive");

    public static readonly KeyValuePair<string, object?> Sent = new("network.io.direction", "transmit");

    /// <summary>Why a loop was handed off, or a connection demoted: application code asleep in a blocking call, or computing.</summary>
    public static readonly KeyValuePair<string, object?> Blocked = new("kestrel.transport.linux.handoff.reason", "blocked");

    public static readonly KeyValuePair<string, object?> Computing = new("kestrel.transport.linux.handoff.reason", "computing");

    public static readonly KeyValuePair<string, object?> RefusedAtThreadLimit = new("error.type", "thread_limit");

    public static readonly KeyValuePair<string, object?> RefusedThreadStartFailed = new("error.type", "thread_start_failed");

    /// <summary>
    /// A connection's local endpoint as OpenTelemetry names a server's: server.address (an IP address, or a Unix socket's
    /// path) and server.port (null for a Unix socket). Allocates: for hand-offs and demotions, not per request.
    /// </summary>
    public static (KeyValuePair<string, object?> Address, KeyValuePair<string, object?> Port) EndpointTags(EndPoint? local) => local switch
    {
        IPEndPoint ip => (new("server.address", ip.Address.ToString()), new("server.port", ip.Port)),
        UnixDomainSocketEndPoint unix => (new("server.address", unix.ToString()), new("server.port", null)),
        _ => (new("server.address", local?.ToString()), new("server.port", null)),
    };

    /// <summary>The threads of an Adaptive loop group, for the loop.threads and loop.standbys instruments, from its start to its end.</summary>
    public void Add(LoopThreads threads)
    {
        lock (_gate)
        {
            _threads.Add(threads);
        }
    }

    public void Remove(LoopThreads threads)
    {
        lock (_gate)
        {
            _threads.Remove(threads);
        }
    }

    public void Add(EventLoop loop)
    {
        lock (_gate)
        {
            _loops.Add(loop);
        }
    }

    private long Sum(Func<EventLoop, long> read)
    {
        lock (_gate)
        {
            long total = _retired.Passes;
            foreach (var loop in _loops)
            {
                total += read(loop);
            }

            return total;
        }
    }

    private long SumThreads(Func<LoopThreads, int> read)
    {
        lock (_gate)
        {
            long total = 0;
            foreach (var threads in _threads)
            {
                total += read(threads);
            }

            return total;
        }
    }

    private IEnumerable<Measurement<long>> ObserveBytes()
    {
        long received, sent;
        lock (_gate)
        {
            received = _retired.Received;
            sent = _retired.Sent;
            foreach (var loop in _loops)
            {
                received += loop.BytesReceived;
                sent += loop.BytesSent;
            }
        }

        return [new Measurement<long>(received, Received), new Measurement<long>(sent, Sent)];
    }

    private IEnumerable<Measurement<double>> ObservePasses()
    {
        lock (_gate)
        {
            return _loops.Select(static l => new Measurement<double>(l.CurrentPassDuration.TotalSeconds, l.MetricTag)).ToList();
        }
    }

    private (long Passes, long Received, long Sent) _retired;

    /// <summary>Keeps a stopped loop's totals, so the counters stay monotonic.</summary>
    public void Retire(EventLoop loop)
    {
        lock (_gate)
        {
            if (_loops.Remove(loop))
            {
                _retired = (_retired.Passes + loop.PassCount, _retired.Received + loop.BytesReceived, _retired.Sent + loop.BytesSent);
            }
        }
    }

    public static KeyValuePair<string, object?> ErrnoTag(string name) => new("error.type", name);

    public void Dispose() => _meter.Dispose();
}
