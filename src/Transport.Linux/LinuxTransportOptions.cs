using Kestrel.Transport.Linux.Hosting;

namespace Kestrel.Transport.Linux;

/// <summary>
/// Options for the Linux transport. Bind them from code with
/// <c>UseLinuxTransport(o =&gt; ...)</c> or from the configuration section
/// <see cref="ConfigurationSectionName"/>; code runs after configuration. Invalid values fail at
/// start-up with an <see cref="Microsoft.Extensions.Options.OptionsValidationException"/> naming the option.
/// </summary>
public sealed class LinuxTransportOptions
{
    /// <summary>The configuration section the options bind from: <c>Kestrel:LinuxTransport</c>.</summary>
    public const string ConfigurationSectionName = "Kestrel:LinuxTransport";

    /// <summary>
    /// The number of event-loop threads, shared by every endpoint of the server; each owns an epoll instance
    /// and one SO_REUSEPORT listening socket per bound IP endpoint. Who changes it: a server that shares its
    /// machine, to leave cores to other work, or a container whose CPU quota is below its visible cores.
    /// Default: <see cref="Environment.ProcessorCount"/>, at most 16 (one loop per core; 16 matches the Sockets
    /// transport's IOQueueCount cap). Range 1..1024.
    /// </summary>
    public int ThreadCount { get; set; } = Math.Min(Environment.ProcessorCount, 16);

    /// <summary>
    /// Where Kestrel and the application run when data arrives. Default <see cref="ApplicationSchedulingMode.Adaptive"/>:
    /// on the loop thread while the app is quick (no thread hop per read: below saturation it cost 0.22-0.84x Sockets'
    /// CPU per request on .NET 10 and 0.73-0.81x on .NET 11, where ThreadPool cost about what Sockets does), and off it
    /// when the app blocks, so the loop's other connections keep being served. Who changes it: an app that wants every request on the thread pool, as the Sockets transport does
    /// (a handler that blocks often, or a way back while a problem is looked into), sets
    /// <see cref="ApplicationSchedulingMode.ThreadPool"/>; an app that never blocks a thread (no synchronous I/O, no
    /// <c>.Result</c>, no long locks) may set <see cref="ApplicationSchedulingMode.Inline"/>, which spares the watch
    /// for blocked loops.
    /// </summary>
    public ApplicationSchedulingMode ApplicationSchedulingMode { get; set; } = ApplicationSchedulingMode.Adaptive;

    /// <summary>
    /// How the loops hand reads and writes to the kernel. Who changes it: an Inline-scheduling server that wants
    /// io_uring's fewer kernel crossings where the host allows it and epoll where it does not
    /// (<see cref="IoBackend.Auto"/>); an operator who requires io_uring and wants start-up to fail without it
    /// (<see cref="IoBackend.IoUring"/>); one comparing the earlier transport's Linux AIO batches
    /// (<see cref="IoBackend.EpollAio"/>). Default <see cref="IoBackend.Epoll"/>: with the default Adaptive
    /// scheduling (and with ThreadPool) io_uring measured no better, and epoll runs under every seccomp profile.
    /// </summary>
    public IoBackend IoBackend { get; set; } = IoBackend.Epoll;

    /// <summary>
    /// The listen(2) backlog of each listening socket. Who changes it: a server that takes bursts of new
    /// connections faster than its loops accept them. Default: 512, as the Sockets transport. Range 1..65535.
    /// </summary>
    public int Backlog { get; set; } = 512;

    /// <summary>
    /// TCP_NODELAY on accepted TCP connections. Who turns it off: almost nobody; sends are already coalesced
    /// per pass, so Nagle's algorithm would only add delay. Default: true, as the Sockets transport.
    /// </summary>
    public bool NoDelay { get; set; } = true;

    /// <summary>
    /// Bytes the transport may buffer from a socket before the application reads them; when reached, the loop
    /// stops reading that socket until the app has read half. Who changes it: a server with many slow-reading
    /// uploads that wants less memory per connection. Null means unbounded. Default: 1 MiB, as the Sockets transport.
    /// </summary>
    public long? MaxReadBufferSize { get; set; } = 1024 * 1024;

    /// <summary>
    /// Bytes the application may have buffered for sending before its flushes wait for the socket to drain
    /// to half. Who changes it: a server streaming large responses to slow clients that wants to bound (or
    /// loosen) memory per connection. Null means unbounded. Default: 64 KiB, as the Sockets transport.
    /// </summary>
    public long? MaxWriteBufferSize { get; set; } = 64 * 1024;

    /// <summary>
    /// Pin loop <c>i</c> to the <c>i</c>-th CPU the process may use (modulo their number), so a loop, its
    /// sockets' softirq work and its caches stay together. Who turns it on: a server that owns its CPUs (one
    /// per machine or cgroup); harmful where other busy processes share them. Default: false.
    /// </summary>
    public bool CpuAffinity { get; set; }

    /// <summary>
    /// TCP_DEFER_ACCEPT on the listening sockets, in seconds (tcp(7)): the kernel hands over a connection only
    /// once its first data arrives (or the time has passed). Who turns it on: a server facing many clients that
    /// connect and stay silent, where each would cost an accept and a pipe. Not for protocols where the server
    /// speaks first. 0 (the default) leaves it off. Range 0..3600.
    /// </summary>
    public int TcpDeferAcceptSeconds { get; set; }

    /// <summary>
    /// Busy polling, in microseconds: SO_BUSY_POLL on every accepted socket and, on Linux 6.9+, the epoll
    /// instance's busy-poll parameters (EPIOCSPARAMS), so an idle loop polls the NIC's queue before sleeping.
    /// Who turns it on: a latency-bound server with spare CPU on a real NIC with NAPI; it does nothing on
    /// loopback. Above <c>net.core.busy_read</c> it needs CAP_NET_ADMIN; a refusal is logged once per loop.
    /// 0 (the default) is off. Range 0..1000000.
    /// </summary>
    public int BusyPollMicroseconds { get; set; }

    /// <summary>
    /// Before a loop with nothing left to do blocks in epoll_wait, it polls epoll without blocking for up to
    /// this many microseconds, so a request arriving meanwhile finds it running instead of waiting for an idle
    /// CPU to wake. Who turns it on: a low-concurrency, latency-bound server on a VM or a CPU with deep
    /// C-states, that can spend the idle CPU. The loop does not spin while its thread-pool dispatch batch runs.
    /// 0 (the default) is off. Range 0..1000000.
    /// </summary>
    public int SpinBeforeSleepMicroseconds { get; set; }

    /// <summary>
    /// Sends of at least this many bytes use MSG_ZEROCOPY (Linux 4.14): the kernel sends from the output pipe's
    /// pool blocks instead of copying them, and the blocks return to the pool only when the kernel reports it
    /// is done (a graceful close waits for that). Who turns it on: a server sending large responses (tens of
    /// KiB and up) over a real NIC. Over loopback the kernel copies anyway, says so, and the connection stops
    /// asking. A send refused for lack of notification memory (ENOBUFS) goes out again by copying. TCP only.
    /// 0 (the default) is off. Range 0 or 1024..2147483647.
    /// </summary>
    public int ZeroCopySendThreshold { get; set; }

    /// <summary>Measurement switches with fixed defaults: tests and benchmarks only, never configuration.</summary>
    internal TransportTuning Tuning { get; } = new();

    /// <summary>
    /// Kestrel's <c>Microsoft.AspNetCore.Server.Kestrel.FinOnError</c> AppContext switch, which the Sockets transport
    /// honours too: an aborted connection ends with FIN (shutdown, then close) instead of RST, for peers (proxies, say)
    /// that lose a response they already received when a reset follows it. Read as Sockets
    /// reads it: once per process, into each options object; tests set it here.
    /// </summary>
    internal bool FinOnError { get; set; } = s_finOnError;

    private static readonly bool s_finOnError = AppContext.TryGetSwitch("Microsoft.AspNetCore.Server.Kestrel.FinOnError", out bool on) && on;

    internal IEnumerable<string> Validate()
    {
        if (ThreadCount is < 1 or > 1024)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(ThreadCount)} must be between 1 and 1024, but was {ThreadCount}.";
        }

        if (!Enum.IsDefined(ApplicationSchedulingMode))
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(ApplicationSchedulingMode)} must be ThreadPool, Inline or Adaptive, but was {(int)ApplicationSchedulingMode}.";
        }

        if (!Enum.IsDefined(IoBackend))
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(IoBackend)} must be Epoll, EpollAio, IoUring or Auto, but was {(int)IoBackend}.";
        }

        if (Backlog is < 1 or > 65535)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(Backlog)} must be between 1 and 65535, but was {Backlog}.";
        }

        if (MaxReadBufferSize is < 0)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(MaxReadBufferSize)} must be null or non-negative, but was {MaxReadBufferSize}.";
        }

        if (MaxWriteBufferSize is < 0)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(MaxWriteBufferSize)} must be null or non-negative, but was {MaxWriteBufferSize}.";
        }

        if (TcpDeferAcceptSeconds is < 0 or > 3600)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(TcpDeferAcceptSeconds)} must be between 0 and 3600, but was {TcpDeferAcceptSeconds}.";
        }

        if (BusyPollMicroseconds is < 0 or > 1_000_000)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(BusyPollMicroseconds)} must be between 0 and 1000000, but was {BusyPollMicroseconds}.";
        }

        if (SpinBeforeSleepMicroseconds is < 0 or > 1_000_000)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(SpinBeforeSleepMicroseconds)} must be between 0 and 1000000, but was {SpinBeforeSleepMicroseconds}.";
        }

        if (ZeroCopySendThreshold is < 0 or (> 0 and < 1024))
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(ZeroCopySendThreshold)} must be 0 (off) or at least 1024, but was {ZeroCopySendThreshold}.";
        }

        foreach (string failure in Tuning.Validate())
        {
            yield return failure;
        }
    }
}
