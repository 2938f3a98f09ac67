namespace Kestrel.Transport.Linux;

/// <summary>
/// Options for the Linux transport. Bind them from code with
/// <c>UseLinuxTransport(o =&gt; ...)</c> or from the configuration section
/// <see cref="ConfigurationSectionName"/>.
/// </summary>
public sealed class LinuxTransportOptions
{
    /// <summary>The configuration section the options bind from: <c>Kestrel:LinuxTransport</c>.</summary>
    public const string ConfigurationSectionName = "Kestrel:LinuxTransport";

    /// <summary>
    /// The number of event-loop threads, shared by every endpoint of the server. Each thread owns
    /// an epoll instance and one SO_REUSEPORT listening socket per bound IP endpoint.
    /// Default: <see cref="Environment.ProcessorCount"/>, at most 16 (one loop per core, the
    /// thread-per-core design; 16 matches the Sockets transport's IOQueueCount cap). Range 1..1024.
    /// </summary>
    public int ThreadCount { get; set; } = Math.Min(Environment.ProcessorCount, 16);

    /// <summary>
    /// Where application continuations run. Default <see cref="ApplicationSchedulingMode.ThreadPool"/>,
    /// the safe choice; <see cref="ApplicationSchedulingMode.Inline"/> runs them on the loop thread.
    /// </summary>
    public ApplicationSchedulingMode ApplicationSchedulingMode { get; set; } = ApplicationSchedulingMode.ThreadPool;

    /// <summary>
    /// Defer sends to the end of the event-loop pass and coalesce everything a connection flushed
    /// during the pass into one writev. When false, a flush is sent on the next pass of the loop
    /// without waiting for the rest of the pass's receives. Default: true.
    /// </summary>
    public bool DeferSend { get; set; } = true;

    /// <summary>
    /// With <see cref="ApplicationSchedulingMode.ThreadPool"/> scheduling, a connection's flushed output is
    /// sent from the thread pool, by the thread draining the transport's dispatch batch (where in the
    /// batch: <see cref="CoalesceThreadPoolSends"/>), with one sendmsg carrying everything flushed so far,
    /// instead of being handed back to the event loop for the end of the loop's next pass. That saves a
    /// hand-off between threads, and a loop wake-up, per response. A send the socket cannot take whole
    /// goes back to the loop, which waits for EPOLLOUT. When true, <see cref="DeferSend"/> and
    /// <see cref="AioSend"/> apply only to the sends the loop still makes. Ignored with
    /// <see cref="ApplicationSchedulingMode.Inline"/> scheduling, where the app already runs on the loop.
    /// Default: true.
    /// </summary>
    public bool SendFromThreadPool { get; set; } = true;

    /// <summary>
    /// With <see cref="SendFromThreadPool"/>, a flush's send joins the end of the transport's thread-pool
    /// batch, behind the continuations (other connections' requests) already waiting in it, so that the
    /// responses of one batch leave in a burst, as Kestrel's Sockets transport sends from its IOQueue.
    /// When false, the send runs before them, right after the continuation that flushed. Sending each
    /// response alone, one app's worth of work after the last, lets the peer fall asleep between
    /// responses and makes every send pay for waking it. Default: true.
    /// </summary>
    public bool CoalesceThreadPoolSends { get; set; } = true;

    /// <summary>
    /// Submit each pass's receives as one Linux AIO <c>io_submit</c> (IOCB_CMD_PREADV) instead of one
    /// readv per socket. Falls back to readv, logged once, when <c>io_setup</c> fails
    /// (for example when <c>fs.aio-max-nr</c> is exhausted). Default: false.
    /// </summary>
    public bool AioReceive { get; set; }

    /// <summary>
    /// Submit each pass's sends as one Linux AIO <c>io_submit</c> (IOCB_CMD_PWRITEV) instead of one
    /// sendmsg per socket. Falls back like <see cref="AioReceive"/>. Default: false.
    /// </summary>
    public bool AioSend { get; set; }

    /// <summary>The listen(2) backlog of each listening socket. Default: 512, as the Sockets transport. Range 1..65535.</summary>
    public int Backlog { get; set; } = 512;

    /// <summary>Set TCP_NODELAY on accepted TCP connections. Default: true, as the Sockets transport.</summary>
    public bool NoDelay { get; set; } = true;

    /// <summary>
    /// Bytes the transport may buffer from the socket before the application reads them; when reached,
    /// the loop stops reading from that socket until the app catches up. Null means unbounded.
    /// Default: 1 MiB, as the Sockets transport.
    /// </summary>
    public long? MaxReadBufferSize { get; set; } = 1024 * 1024;

    /// <summary>
    /// Bytes the application may have buffered for sending before its flushes wait for the socket to
    /// drain. Null means unbounded. Default: 64 KiB, as the Sockets transport.
    /// </summary>
    public long? MaxWriteBufferSize { get; set; } = 64 * 1024;

    /// <summary>
    /// The most one read from a socket may ask for, in bytes. Reads adapt to the traffic: they start at
    /// half a 4 KiB pool block, double after a read that filled its buffer and halve after one that used
    /// under a quarter, so a large upload is read in large pieces while small requests never reserve
    /// more than a block. Reads above the pool's block size use a pipe segment from the shared array
    /// pool. 4096 keeps every read within one pool block (the Sockets transport's behaviour).
    /// Default: 65536. Range 2048..1048576.
    /// </summary>
    public int MaxBytesPerRead { get; set; } = 64 * 1024;

    /// <summary>
    /// Pin each event-loop thread to one CPU: loop <c>i</c> runs on the <c>i</c>-th CPU the process may use
    /// (modulo their number), so a loop, its sockets' softirq work and its caches stay together. Useful
    /// when the process owns its CPUs (one server per machine or cgroup); harmful when other busy
    /// processes share them. Default: false.
    /// </summary>
    public bool CpuAffinity { get; set; }

    /// <summary>
    /// Run the event-loop threads under the SCHED_BATCH policy (sched(7)): same priority, but a loop that
    /// wakes up (a socket became readable) does not preempt the thread running on its CPU; it runs when
    /// that thread blocks, yields or uses up its slice. Where the loops share CPUs with the thread pool
    /// (fewer cores than busy threads), the pool then finishes its batch of requests, sending as it goes
    /// (<see cref="SendFromThreadPool"/>), and the loop reads every socket that became readable meanwhile
    /// in one pass, instead of preempting the pool after each response. On idle CPUs a wake-up needs no
    /// preemption, so it changes nothing there. A refusal (a seccomp profile) is logged once per loop.
    /// Default: true.
    /// </summary>
    public bool SchedBatchLoops { get; set; } = true;

    /// <summary>
    /// Register each connection level-triggered with EPOLLONESHOT and re-arm it with
    /// <c>epoll_ctl(EPOLL_CTL_MOD)</c> after every event, for what it then waits on: readable, and
    /// writable only while a send the socket could not take whole waits. That is the registration of
    /// the earlier Linux transport. By default (false) a connection is registered once, edge-triggered,
    /// for reads and writes together, and is never re-armed: an <c>epoll_ctl</c> per request fewer.
    /// Exists to measure that difference (docs/options.md); there is no known reason to turn it on.
    /// Not with <see cref="ZeroCopySendThreshold"/>: zero-copy completions are reported as EPOLLERR,
    /// which a one-shot registration that has nothing else to wait on would not report. Default: false.
    /// </summary>
    public bool OneShotRegistrations { get; set; }

    /// <summary>
    /// TCP_DEFER_ACCEPT on the listening sockets, in seconds (tcp(7)): the kernel completes a connection
    /// to the server only once its first data arrives (or the time has passed), so clients that
    /// connect and send nothing never cost an accept or a pipe. 0 (the default) leaves it off. Range 0..3600.
    /// </summary>
    public int TcpDeferAcceptSeconds { get; set; }

    /// <summary>
    /// Busy polling, in microseconds (0, the default, is off): SO_BUSY_POLL on every accepted socket and,
    /// where the kernel has them (Linux 6.9+), the epoll instance's busy-poll parameters (EPIOCSPARAMS),
    /// so an idle loop polls the NIC's queue for this long before sleeping. Trades CPU for latency on
    /// real NICs with NAPI; it does nothing on loopback. Raising SO_BUSY_POLL above
    /// <c>net.core.busy_read</c> needs CAP_NET_ADMIN; a refusal is logged once per loop. Range 0..1000000.
    /// </summary>
    public int BusyPollMicroseconds { get; set; }

    /// <summary>
    /// Before an event loop with nothing left to do blocks in epoll_wait, it polls epoll without blocking
    /// for up to this many microseconds (0, the default, is off). A request that arrives meanwhile is
    /// picked up at once, without the CPU going idle and the loop thread being woken: where waking an
    /// idle CPU is slow (virtual machines, deep C-states), that wake-up is most of a request's latency at
    /// low concurrency. The price is CPU: after every pass, an idle loop keeps its CPU busy this long.
    /// The loop does not start a spin while its thread-pool dispatch batch runs, so that it does not take
    /// the CPU from the batch; it helps Inline scheduling most. Range 0..1000000.
    /// </summary>
    public int SpinBeforeSleepMicroseconds { get; set; }

    /// <summary>
    /// Set TCP_QUICKACK on accepted sockets and again after every receive (Linux clears it on its own,
    /// tcp(7)), so the kernel acknowledges at once instead of delaying the ACK for a response to carry.
    /// Costs one setsockopt per read. Default: false.
    /// </summary>
    public bool TcpQuickAck { get; set; }

    /// <summary>
    /// TCP_NOTSENT_LOWAT on accepted sockets, in bytes (0, the default, leaves the system setting
    /// <c>net.ipv4.tcp_notsent_lowat</c>): the socket reports writable only when fewer unsent bytes than this
    /// are queued, which keeps large responses in the pipe (where backpressure applies) instead of the
    /// kernel's send buffer. Range 0..2147483647.
    /// </summary>
    public int TcpNotSentLowAtBytes { get; set; }

    /// <summary>
    /// Sends of at least this many bytes use MSG_ZEROCOPY (Linux 4.14): the kernel sends from the
    /// pipe's pool blocks instead of copying them into the socket, and reports on the socket's error
    /// queue when it is done with them; only then do the blocks go back to the pool, and a graceful
    /// close waits for that. 0 (the default) leaves it off. Worth it only for large responses over a
    /// real NIC: over loopback the kernel copies anyway and says so, and the transport then stops using
    /// it on that connection. A send the kernel refuses for lack of notification memory (ENOBUFS) is
    /// made again, copied. TCP only. Range 0 or 1024..2147483647.
    /// </summary>
    public int ZeroCopySendThreshold { get; set; }

    /// <summary>
    /// Use the native batch engine (libktl_native.so) when it can be loaded. When false, or when the
    /// library is missing, the transport performs the same batches with managed P/Invoke calls.
    /// </summary>
    internal bool UseNativeEngine { get; set; } = true;

    /// <summary>
    /// Keep sending with MSG_ZEROCOPY after the kernel reported that it copied (for tests and benchmarks
    /// over loopback, where it always copies, so that the zero-copy path runs at all).
    /// </summary>
    internal bool ZeroCopyWhenKernelCopies { get; set; }

    internal IEnumerable<string> Validate()
    {
        if (ThreadCount is < 1 or > 1024)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(ThreadCount)} must be between 1 and 1024, but was {ThreadCount}.";
        }

        if (!Enum.IsDefined(ApplicationSchedulingMode))
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(ApplicationSchedulingMode)} must be ThreadPool or Inline, but was {(int)ApplicationSchedulingMode}.";
        }

        if (Backlog is < 1 or > 65535)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(Backlog)} must be between 1 and 65535, but was {Backlog}.";
        }

        if (MaxBytesPerRead is < 2048 or > 1024 * 1024)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(MaxBytesPerRead)} must be between 2048 and 1048576, but was {MaxBytesPerRead}.";
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

        if (TcpNotSentLowAtBytes < 0)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(TcpNotSentLowAtBytes)} must be non-negative, but was {TcpNotSentLowAtBytes}.";
        }

        if (ZeroCopySendThreshold is < 0 or (> 0 and < 1024))
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(ZeroCopySendThreshold)} must be 0 (off) or at least 1024, but was {ZeroCopySendThreshold}.";
        }

        if (OneShotRegistrations && ZeroCopySendThreshold > 0)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(OneShotRegistrations)} cannot be combined with {nameof(ZeroCopySendThreshold)} ({ZeroCopySendThreshold}): a one-shot registration would miss the kernel's zero-copy completions.";
        }

        if (MaxReadBufferSize is < 0)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(MaxReadBufferSize)} must be null or non-negative, but was {MaxReadBufferSize}.";
        }

        if (MaxWriteBufferSize is < 0)
        {
            yield return $"{nameof(LinuxTransportOptions)}.{nameof(MaxWriteBufferSize)} must be null or non-negative, but was {MaxWriteBufferSize}.";
        }
    }
}
