using System.Buffers;
using System.Collections.Concurrent;
using System.Diagnostics;
using System.IO.Pipelines;
using System.Runtime.InteropServices;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Listening;
using Kestrel.Transport.Linux.Scheduling;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// One thread, one epoll instance. Each pass: wait for events, accept, receive every readable
/// socket in one batch, run the continuations queued to this loop, then send everything that was
/// flushed during the pass in one batch. Connections never leave the loop that accepted them.
/// </summary>
internal sealed unsafe class EventLoop : PipeScheduler
{
    private const int MaxEventsPerWait = 256;
    private const int MaxAcceptsPerEvent = 64;
    private const int Awake = 0;
    private const int Sleeping = 1;
    private const int Notified = 2;

    /// <summary>Asleep, but for at most <see cref="DispatchPollMs"/>: a dispatch batch was queued or running.</summary>
    private const int Polling = 3;
    private const int DispatchPollMs = 1;

    [ThreadStatic]
    private static EventLoop? t_current;

    private readonly LinuxTransportOptions _options;
    private readonly ThreadPoolDispatchQueue? _dispatchQueue;

    /// <summary><see cref="LinuxTransportOptions.SpinBeforeSleepMicroseconds"/> in <see cref="Stopwatch"/> ticks (0: off).</summary>
    private readonly long _spinTicks;
    private readonly TransportMetrics _metrics;
    private readonly ILogger _logger;
    private readonly Thread _thread;
    private readonly ConcurrentQueue<ScheduledWork> _workQueue = new();
    private readonly IoBatch _batch = new();
    private readonly TaskCompletionSource _stopped = new(TaskCreationOptions.RunContinuationsAsynchronously);
    private readonly HashSet<LinuxConnection> _connections = [];
    private readonly List<ListenRegistration> _listeners = [];
    private readonly bool _useAio;
    private readonly int _epollFd;
    private readonly int _eventFd;

    private object?[] _registrations = new object?[1024];
    private List<LinuxConnection> _receiveQueue = [];
    private List<LinuxConnection> _receiveRunning = [];
    private List<LinuxConnection> _sendQueue = [];
    private List<LinuxConnection> _sendRunning = [];
    private int _state;
    private bool _stopRequested;
    private bool _abortOnStop;
    private bool _exited;
    private bool _batchRunning;
    private int _threadId;

    // Socket options the options ask for on accepted sockets; each one that the kernel refuses is
    // logged once for this loop and then no longer tried.
    private bool _applyBusyPoll;
    private bool _applyQuickAck;
    private bool _applyNotSentLowAt;
    private bool _applyZeroCopy;
    private int _zeroCopyRefusedLogged;

    // Totals read by the meter's observable instruments; written only by this loop's thread.
    private long _passCount;
    private long _bytesReceived;
    private long _bytesSent;
    private long _bytesSentOffLoop;

    public EventLoop(int index, LinuxTransportOptions options, MemoryPool<byte> pool, ILogger logger, TransportMetrics metrics)
    {
        Index = index;
        _options = options;
        _logger = logger;
        _metrics = metrics;
        Pool = pool;

        _epollFd = Errno.ThrowIfError(Epoll.Create(), "epoll_create1");
        _eventFd = EventFd.Create();
        if (_eventFd < 0)
        {
            LibC.CloseFd(_epollFd);
            throw Errno.ToException(-_eventFd, "eventfd");
        }

        SetRegistration(_eventFd, this);
        Epoll.Control(_epollFd, Epoll.EPOLL_CTL_ADD, _eventFd, Epoll.EPOLLIN);

        bool wantsAio = options.IoBackend == IoBackend.EpollAio;
        Engine = BatchEngine.Create(options.Tuning.UseNativeEngine, wantsAio ? MaxEventsPerWait * 2 : 0, out int aioError);
        if (wantsAio && !Engine.HasAio)
        {
            string why = aioError != 0
                ? $"io_setup failed: {Errno.Describe(aioError)}; check fs.aio-max-nr"
                : $"the {Engine.Name} engine has no AIO path ({NativeEngine.LoadError ?? "native engine disabled by options"})";
            TransportLog.AioUnavailable(logger, index, why);
            metrics.AioFallbacks.Add(1);
        }

        _useAio = wantsAio && Engine.HasAio;

        _dispatchQueue = options.ApplicationSchedulingMode == ApplicationSchedulingMode.Inline ? null : new ThreadPoolDispatchQueue(this);
        ApplicationScheduler = (PipeScheduler?)_dispatchQueue ?? Inline;

        // Computed once per loop, not per connection. The transport's own side of each pipe
        // (writing input, reading output) continues on this loop.
        long maxRead = options.MaxReadBufferSize ?? 0;
        long maxWrite = options.MaxWriteBufferSize ?? 0;
        InputPipeOptions = new PipeOptions(pool, ApplicationScheduler, this, maxRead, maxRead / 2, useSynchronizationContext: false);
        // With SendFromThreadPool the app's pool threads send what they flushed themselves (LinuxConnection).
        var outputReaderScheduler = _dispatchQueue is not null && options.Tuning.SendFromThreadPool ? _dispatchQueue.CreateSendScheduler(options.Tuning.CoalesceThreadPoolSends) : (PipeScheduler)this;
        // With zero-copy sends the output pipes' blocks come back only once the kernel is done with them (ZeroCopy.cs).
        ZeroCopyPool = options.ZeroCopySendThreshold > 0 ? new ZeroCopyMemoryPool(pool) : null;
        OutputPipeOptions = new PipeOptions(ZeroCopyPool ?? pool, outputReaderScheduler, ApplicationScheduler, maxWrite, maxWrite / 2, useSynchronizationContext: false);

        _applyBusyPoll = options.BusyPollMicroseconds > 0;
        _spinTicks = options.SpinBeforeSleepMicroseconds * Stopwatch.Frequency / 1_000_000;
        _applyQuickAck = options.Tuning.TcpQuickAck;
        _applyNotSentLowAt = options.Tuning.TcpNotSentLowAtBytes > 0;
        _applyZeroCopy = options.ZeroCopySendThreshold > 0;
        if (options.BusyPollMicroseconds > 0)
        {
            int rc = Epoll.SetBusyPollParameters(_epollFd, (uint)options.BusyPollMicroseconds);
            if (rc < 0)
            {
                TransportLog.OptionNotApplied(logger, "epoll busy-poll parameters (EPIOCSPARAMS)", $"loop {index}", Errno.Describe(-rc));
            }
        }

        _thread = new Thread(Run) { IsBackground = true, Name = $"Kestrel Linux loop {index}" };
        metrics.Add(this);
    }

    public int Index { get; }

    /// <summary>The most one read may ask for (<see cref="TransportTuning.MaxBytesPerRead"/>).</summary>
    public int MaxBytesPerRead => _options.Tuning.MaxBytesPerRead;

    /// <summary>The loop's epoll instance (for tests and diagnostics).</summary>
    public int EpollFd => _epollFd;

    /// <summary>The kernel's id of the loop thread (0 until it runs).</summary>
    public int ThreadId => Volatile.Read(ref _threadId);

    /// <summary>True when receives re-arm TCP_QUICKACK (tcp(7): the kernel clears it by itself).</summary>
    public bool QuickAck => _applyQuickAck;

    /// <summary>True when accepted TCP sockets get SO_ZEROCOPY (until the kernel refuses it once).</summary>
    public bool ZeroCopy => _applyZeroCopy;

    /// <summary>
    /// A MSG_ZEROCOPY send of this loop's connections that the kernel refused with ENOBUFS (on the loop,
    /// or on a pool thread that sends): counted, and logged the first time for this loop.
    /// </summary>
    public void OnZeroCopyRefused()
    {
        _metrics.ZeroCopyRefusals.Add(1);
        if (Interlocked.Exchange(ref _zeroCopyRefusedLogged, 1) == 0)
        {
            TransportLog.ZeroCopyRefused(_logger, Index);
        }
    }

    /// <summary>Sends of at least this many bytes use MSG_ZEROCOPY (<see cref="LinuxTransportOptions.ZeroCopySendThreshold"/>).</summary>
    public int ZeroCopySendThreshold => _options.ZeroCopySendThreshold;

    /// <summary>The output pipes' pool when zero-copy sends are on (its count of outstanding blocks is for tests and diagnostics).</summary>
    public ZeroCopyMemoryPool? ZeroCopyPool { get; }

    public TransportMetrics Metrics => _metrics;

    public long PassCount => Volatile.Read(ref _passCount);

    public long BytesReceived => Volatile.Read(ref _bytesReceived);

    public long BytesSent => Volatile.Read(ref _bytesSent) + Volatile.Read(ref _bytesSentOffLoop);

    /// <summary>Counts bytes a pool thread sent for one of this loop's connections (any thread).</summary>
    public void AddBytesSentOffLoop(long bytes) => Interlocked.Add(ref _bytesSentOffLoop, bytes);

    public MemoryPool<byte> Pool { get; }

    public BatchEngine Engine { get; }

    public PipeScheduler ApplicationScheduler { get; }

    public PipeOptions InputPipeOptions { get; }

    public PipeOptions OutputPipeOptions { get; }

    public LinuxTransportOptions Options => _options;

    /// <summary>True when this loop's receive and send batches go through io_submit.</summary>
    public bool UsesAio => _useAio;

    /// <summary>Completes when the thread has exited and every fd it owned is closed.</summary>
    public Task Stopped => _stopped.Task;

    public void Start() => _thread.Start();

    /// <summary>
    /// Asks the loop to end: at once when <paramref name="abortConnections"/> (connections are reset),
    /// otherwise once its last listener is gone and its last connection has closed.
    /// </summary>
    public void Stop(bool abortConnections) => Post(static s =>
    {
        var (loop, abort) = ((EventLoop, bool))s!;
        loop._stopRequested = true;
        if (abort)
        {
            loop._abortOnStop = true;
            var reason = new Microsoft.AspNetCore.Connections.ConnectionAbortedException("The Linux transport is shutting down.");
            foreach (var connection in loop._connections.ToArray())
            {
                connection.AbortOnLoop(reason);
            }
        }
    }, (this, abortConnections));

    /// <summary>Runs <paramref name="action"/> on this loop's thread during its next pass.</summary>
    public override void Schedule(Action<object?> action, object? state)
    {
        _workQueue.Enqueue(new ScheduledWork(action, state));
        if (Volatile.Read(ref _exited))
        {
            // The loop is gone: let the thread pool run what is left so pipes still complete.
            DrainToThreadPool();
            return;
        }

        if (t_current == this)
        {
            return;
        }

        // Continuations that this loop's own dispatch batch schedules (each response flush of a
        // pipelined batch, say) wake the loop once when the batch ends, not once per flush. That is
        // safe only while the loop is sure to look again without it: awake (it checks the queue
        // before it sleeps), already notified, or polling because it knew of the batch. A loop that
        // went to sleep before the batch was queued could otherwise sleep forever under a batch that
        // blocks (synchronous body I/O waiting for this very loop), so that one is woken now.
        if (_dispatchQueue is not null && _dispatchQueue.IsBatchThread)
        {
            Interlocked.MemoryBarrier(); // the enqueue above before the read of _state, as in Wake's CompareExchange
            if (Volatile.Read(ref _state) != Sleeping)
            {
                ThreadPoolDispatchQueue.WakeLoopAtBatchEnd();
                return;
            }
        }

        Wake();
    }

    /// <summary>Writes the eventfd only when the loop may be blocked in epoll_wait, at most once per sleep.</summary>
    public void Wake()
    {
        int state = Interlocked.CompareExchange(ref _state, Notified, Sleeping);
        if (state == Sleeping || (state == Polling && Interlocked.CompareExchange(ref _state, Notified, Polling) == Polling))
        {
            EventFd.Signal(_eventFd);
        }
    }

    /// <summary>
    /// Wakes the loop if it sleeps without a poll deadline, so that it starts polling (and watching
    /// for stalled continuations) while a dispatch batch it did not know of is running.
    /// </summary>
    public void WakeIfNotPolling()
    {
        if (Interlocked.CompareExchange(ref _state, Notified, Sleeping) == Sleeping)
        {
            EventFd.Signal(_eventFd);
        }
    }

    /// <summary>True on this loop's own thread.</summary>
    public bool IsLoopThread => t_current == this;

    public void Post(Action<object?> action, object? state) => Schedule(action, state);

    public void AddListener(ListenRegistration registration) => Post(static s =>
    {
        var r = (ListenRegistration)s!;
        r.Loop.AddListenerOnLoop(r);
    }, registration);

    public void RemoveListener(ListenRegistration registration) => Post(static s =>
    {
        var r = (ListenRegistration)s!;
        r.Loop.RemoveListenerOnLoop(r);
    }, registration);

    /// <summary>Queues a receive for the next batch (loop thread only).</summary>
    public void QueueReceive(LinuxConnection connection) => _receiveQueue.Add(connection);

    /// <summary>Queues a send for the end of this pass (loop thread only).</summary>
    public void QueueSend(LinuxConnection connection) => _sendQueue.Add(connection);

    /// <summary>Sends one connection's data now, outside the pass-end batch (DeferSend = false).</summary>
    public void SendNow(LinuxConnection connection)
    {
        if (_batch.Count > 0 || _batchRunning)
        {
            // Called from inside a batch's completions: the batch is busy, so send at the pass end.
            QueueSend(connection);
            return;
        }

        connection.PrepareSend(_batch);
        RunBatch(NativeEngine.Send, _useAio);
    }

    public void Register(LinuxConnection connection)
    {
        SetRegistration(connection.Fd, connection);
        _connections.Add(connection);
        _metrics.CurrentConnections.Add(1);
        _metrics.TotalConnections.Add(1);
        int rc = Epoll.Control(_epollFd, Epoll.EPOLL_CTL_ADD, connection.Fd, LinuxConnection.RegistrationEvents);
        if (rc < 0)
        {
            connection.Fail(Errno.ToException(-rc, "epoll_ctl(ADD)"));
        }
    }

    /// <summary>Forgets a connection whose fd is about to be closed (loop thread only).</summary>
    public void Unregister(LinuxConnection connection)
    {
        if (connection.Fd < _registrations.Length && _registrations[connection.Fd] == connection)
        {
            _registrations[connection.Fd] = null;
        }

        if (_connections.Remove(connection))
        {
            _metrics.CurrentConnections.Add(-1);
        }
    }

    private void SetRegistration(int fd, object value)
    {
        if (fd >= _registrations.Length)
        {
            Array.Resize(ref _registrations, Math.Max(fd + 1, _registrations.Length * 2));
        }

        _registrations[fd] = value;
    }

    private void AddListenerOnLoop(ListenRegistration registration)
    {
        if (_stopRequested && _abortOnStop)
        {
            registration.Added.TrySetResult();
            return;
        }

        SetRegistration(registration.Fd, registration);
        _listeners.Add(registration);
        uint events = Epoll.EPOLLIN | (registration.Shared ? Epoll.EPOLLEXCLUSIVE : 0);
        int rc = Epoll.Control(_epollFd, Epoll.EPOLL_CTL_ADD, registration.Fd, events);
        if (rc < 0)
        {
            TransportLog.ListenerRegistrationFailed(_logger, Index, registration.Listener.EndPoint, Errno.Describe(-rc));
        }

        registration.Added.TrySetResult();
    }

    private void RemoveListenerOnLoop(ListenRegistration registration)
    {
        if (_listeners.Remove(registration))
        {
            Epoll.Control(_epollFd, Epoll.EPOLL_CTL_DEL, registration.Fd, 0);
            if (registration.Fd < _registrations.Length && _registrations[registration.Fd] == registration)
            {
                _registrations[registration.Fd] = null;
            }
        }

        // The fd is closed by its owner once every loop has let go of it.
        registration.Removed.TrySetResult();
    }

    private void Run()
    {
        t_current = this;
        Volatile.Write(ref _threadId, Affinity.CurrentThreadId());
        if (_options.CpuAffinity)
        {
            PinThread();
        }

        if (_options.Tuning.SchedBatchLoops)
        {
            int rc = Affinity.SetCurrentThreadBatch();
            if (rc < 0)
            {
                TransportLog.OptionNotApplied(_logger, "SchedBatchLoops (sched_setscheduler SCHED_BATCH)", $"loop {Index}", Errno.Describe(-rc));
            }
        }

        byte* events = (byte*)NativeMemory.Alloc((nuint)(MaxEventsPerWait * Epoll.EventSize));
        try
        {
            TransportLog.LoopStarted(_logger, Index, Engine.Name, _useAio);
            while (true)
            {
                int timeout = ComputeTimeout(out bool polling);
                if (timeout != 0)
                {
                    // Pairs with the CompareExchange in Wake and the barrier in Schedule: whoever
                    // enqueues after this sees Sleeping (or Polling) and wakes us.
                    Interlocked.Exchange(ref _state, polling ? Polling : Sleeping);
                    if (!_workQueue.IsEmpty)
                    {
                        timeout = 0;
                    }
                }

                int count = timeout != 0 && _spinTicks > 0 && !polling
                    ? SpinThenWait(events, timeout)
                    : Epoll.Wait(_epollFd, events, MaxEventsPerWait, timeout);
                Volatile.Write(ref _state, Awake);
                Volatile.Write(ref _passCount, _passCount + 1);
                if (_metrics.EventsPerPass.Enabled)
                {
                    _metrics.EventsPerPass.Record(Math.Max(count, 0));
                }

                for (int i = 0; i < count; i++)
                {
                    Dispatch(Epoll.FdAt(events, i), Epoll.EventsAt(events, i));
                }

                RunReceives();
                RunScheduledWork();
                RunSends();
                RetryBackedOffListeners();
                _dispatchQueue?.HelpIfStalled();

                if (_stopRequested && ReadyToExit())
                {
                    break;
                }
            }
        }
        catch (Exception e)
        {
            // Only a bug in the loop itself gets here; connections' faults are caught per connection.
            TransportLog.LoopFailed(_logger, Index, e);
        }
        finally
        {
            NativeMemory.Free(events);
            Shutdown();
            t_current = null;
        }
    }

    /// <summary>
    /// <see cref="LinuxTransportOptions.SpinBeforeSleepMicroseconds"/>: polls epoll without blocking until
    /// something is ready, work is posted, or the spin's time is up, and only then waits. The loop's state
    /// already says it may sleep, so a thread that posts work meanwhile also writes the eventfd, which the
    /// next poll sees: nothing posted during the spin can be missed.
    /// </summary>
    private int SpinThenWait(byte* events, int timeout)
    {
        long end = Stopwatch.GetTimestamp() + _spinTicks;
        do
        {
            int count = Epoll.Wait(_epollFd, events, MaxEventsPerWait, 0);
            if (count != 0 || !_workQueue.IsEmpty)
            {
                return count;
            }
        }
        while (Stopwatch.GetTimestamp() < end);

        return Epoll.Wait(_epollFd, events, MaxEventsPerWait, timeout);
    }

    private void PinThread()
    {
        var cpus = Affinity.AllowedCpus(out int errno);
        int rc = cpus.Count == 0 ? -errno : Affinity.PinCurrentThread(cpus[Index % cpus.Count]);
        if (rc < 0)
        {
            TransportLog.OptionNotApplied(_logger, "CpuAffinity (sched_setaffinity)", $"loop {Index}", Errno.Describe(-rc));
        }
        else
        {
            TransportLog.LoopPinned(_logger, Index, cpus[Index % cpus.Count]);
        }
    }

    /// <summary>Sets the per-socket options the options ask for on an accepted TCP socket.</summary>
    private void ApplyAcceptedSocketOptions(int fd)
    {
        if (_options.NoDelay)
        {
            Interop.Socket.SetOption(fd, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_NODELAY, 1);
        }

        if (_applyBusyPoll)
        {
            _applyBusyPoll = TrySetOption(fd, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_BUSY_POLL, _options.BusyPollMicroseconds, "SO_BUSY_POLL");
        }

        if (_applyQuickAck)
        {
            _applyQuickAck = TrySetOption(fd, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_QUICKACK, 1, "TCP_QUICKACK");
        }

        if (_applyNotSentLowAt)
        {
            _applyNotSentLowAt = TrySetOption(fd, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_NOTSENT_LOWAT, _options.Tuning.TcpNotSentLowAtBytes, "TCP_NOTSENT_LOWAT");
        }

        if (_applyZeroCopy)
        {
            _applyZeroCopy = TrySetOption(fd, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_ZEROCOPY, 1, "ZeroCopySendThreshold (SO_ZEROCOPY)");
        }
    }

    private bool TrySetOption(int fd, int level, int name, int value, string option)
    {
        int rc = Interop.Socket.SetOption(fd, level, name, value);
        if (rc < 0)
        {
            TransportLog.OptionNotApplied(_logger, option, $"accepted sockets of loop {Index}", Errno.Describe(-rc));
            return false;
        }

        return true;
    }

    private int ComputeTimeout(out bool polling)
    {
        polling = false;
        if (_receiveQueue.Count > 0 || _sendQueue.Count > 0 || !_workQueue.IsEmpty || (_stopRequested && ReadyToExit()))
        {
            return 0;
        }

        int timeout = -1;
        if (_backedOff.Count > 0)
        {
            long wait = _backedOff.Min(static r => r.RetryAt) - Environment.TickCount64;
            timeout = (int)Math.Clamp(wait, 0, 1000);
        }

        // While a dispatch batch is queued or runs, its wake-up comes when the batch ends. Should the
        // app block inside the batch waiting for this loop (synchronous I/O under backpressure), a
        // short poll keeps that from turning into a deadlock, and lets HelpIfStalled look.
        if (_dispatchQueue is { IsActive: true })
        {
            timeout = timeout < 0 ? DispatchPollMs : Math.Min(timeout, DispatchPollMs);
            polling = true;
        }

        return timeout;
    }

    private bool ReadyToExit() => _connections.Count == 0 && (_listeners.Count == 0 || _abortOnStop);

    private void DrainToThreadPool()
    {
        while (_workQueue.TryDequeue(out var work))
        {
            System.Threading.ThreadPool.UnsafeQueueUserWorkItem(static w => w.Run(), work, preferLocal: false);
        }
    }

    private void Dispatch(int fd, uint events)
    {
        object? target = fd < _registrations.Length ? _registrations[fd] : null;
        switch (target)
        {
            case LinuxConnection connection:
                connection.OnEvents(events);
                break;
            case ListenRegistration listener:
                Accept(listener);
                break;
            case EventLoop:
                EventFd.Drain(_eventFd);
                break;
        }
    }

    private void RunReceives()
    {
        if (_receiveQueue.Count == 0)
        {
            return;
        }

        // Receives that complete synchronously may queue the same connection again for the next pass.
        (_receiveQueue, _receiveRunning) = (_receiveRunning, _receiveQueue);
        foreach (var connection in _receiveRunning)
        {
            connection.PrepareReceive(_batch);
        }

        _receiveRunning.Clear();
        RunBatch(NativeEngine.Receive, _useAio);
    }

    private void RunSends()
    {
        if (_sendQueue.Count == 0)
        {
            return;
        }

        (_sendQueue, _sendRunning) = (_sendRunning, _sendQueue);
        if (_metrics.SendQueueLength.Enabled)
        {
            _metrics.SendQueueLength.Record(_sendRunning.Count);
        }

        foreach (var connection in _sendRunning)
        {
            connection.PrepareSend(_batch);
        }

        _sendRunning.Clear();
        RunBatch(NativeEngine.Send, _useAio);
    }

    private void RunBatch(int direction, bool useAio)
    {
        if (_batch.Count == 0)
        {
            return;
        }

        _batchRunning = true;
        try
        {
            _batch.Execute(Engine, direction, useAio);
            long bytes = 0;
            for (int i = 0; i < _batch.Count; i++)
            {
                var connection = _batch.ConnectionAt(i);
                long result = _batch.ResultAt(i);
                bytes += Math.Max(result, 0);
                long requested = _batch.RequestedAt(i);
                try
                {
                    if (direction == NativeEngine.Receive)
                    {
                        connection.CompleteReceive(result, requested);
                    }
                    else
                    {
                        connection.CompleteSend(result, requested);
                    }
                }
                catch (Exception e)
                {
                    TransportLog.ConnectionFault(_logger, connection.ConnectionId, e);
                    connection.Fail(e);
                }
            }

            RecordBytes(direction, bytes);
        }
        finally
        {
            _batch.Clear();
            _batchRunning = false;
        }
    }

    private void RecordBytes(int direction, long bytes)
    {
        bool receive = direction == NativeEngine.Receive;
        if (receive)
        {
            Volatile.Write(ref _bytesReceived, _bytesReceived + bytes);
        }
        else
        {
            Volatile.Write(ref _bytesSent, _bytesSent + bytes);
        }

        if (_metrics.BytesPerPass.Enabled)
        {
            _metrics.BytesPerPass.Record(bytes, receive ? TransportMetrics.Received : TransportMetrics.Sent);
        }
    }

    private void RunScheduledWork()
    {
        // Only what was queued before this point: work queued by this work runs next pass, so a
        // connection that keeps rescheduling itself cannot starve epoll.
        int count = _workQueue.Count;
        while (count-- > 0 && _workQueue.TryDequeue(out var work))
        {
            try
            {
                work.Run();
            }
            catch (Exception e)
            {
                TransportLog.ScheduledWorkFailed(_logger, Index, e);
            }
        }
    }

    private readonly List<ListenRegistration> _backedOff = [];

    private void Accept(ListenRegistration registration)
    {
        Span<byte> address = stackalloc byte[Interop.Socket.MaxAddressLength];
        for (int i = 0; i < MaxAcceptsPerEvent; i++)
        {
            int fd = Interop.Socket.Accept(registration.Fd, address, out int addressLength);
            if (fd >= 0)
            {
                AcceptOne(registration, fd, address[..addressLength]);
                continue;
            }

            int errno = -fd;
            switch (errno)
            {
                case Errno.EAGAIN:
                    return;
                case Errno.EINTR:
                case Errno.ECONNABORTED:
                    // The peer gave up before we took it (accept(2)); the next one may be fine.
                    continue;
                default:
                    // EMFILE, ENFILE, ENOBUFS, ENOMEM, EPERM...: never fatal. Stop polling this
                    // listener for a while: level-triggered, it would otherwise spin the loop.
                    registration.BackOff();
                    _metrics.AcceptErrors.Add(1, TransportMetrics.ErrnoTag(Errno.Name(errno)));
                    TransportLog.AcceptFailed(_logger, Index, registration.Listener.EndPoint, Errno.Describe(errno), registration.BackoffMs);
                    Epoll.Control(_epollFd, Epoll.EPOLL_CTL_MOD, registration.Fd, 0);
                    _backedOff.Add(registration);
                    return;
            }
        }
    }

    private void RetryBackedOffListeners()
    {
        if (_backedOff.Count == 0)
        {
            return;
        }

        long now = Environment.TickCount64;
        for (int i = _backedOff.Count - 1; i >= 0; i--)
        {
            var registration = _backedOff[i];
            if (!_listeners.Contains(registration))
            {
                _backedOff.RemoveAt(i);
            }
            else if (registration.RetryAt <= now)
            {
                _backedOff.RemoveAt(i);
                uint events = Epoll.EPOLLIN | (registration.Shared ? Epoll.EPOLLEXCLUSIVE : 0);
                // EPOLLEXCLUSIVE cannot be used with MOD (epoll_ctl(2)): re-add instead.
                Epoll.Control(_epollFd, Epoll.EPOLL_CTL_DEL, registration.Fd, 0);
                Epoll.Control(_epollFd, Epoll.EPOLL_CTL_ADD, registration.Fd, events);
            }
        }
    }

    private void AcceptOne(ListenRegistration registration, int fd, ReadOnlySpan<byte> address)
    {
        LinuxConnection? connection = null;
        try
        {
            var remote = Interop.Socket.ParseAddress(address);
            if (remote is System.Net.IPEndPoint)
            {
                ApplyAcceptedSocketOptions(fd);
            }

            var local = Interop.Socket.GetLocalEndPoint(fd) ?? registration.Listener.EndPoint;
            connection = new LinuxConnection(this, fd, local, remote);
            registration.ResetBackoff();
            Register(connection);
            connection.Start();
            if (!registration.Listener.Offer(connection))
            {
                connection.AbortOnLoop(new Microsoft.AspNetCore.Connections.ConnectionAbortedException("The listener was unbound."));
            }
        }
        catch (Exception e)
        {
            TransportLog.ConnectionFault(_logger, connection?.ConnectionId ?? "(accepting)", e);
            if (connection is null)
            {
                LibC.CloseFd(fd);
            }
            else
            {
                connection.Fail(e);
            }
        }
    }

    private void Shutdown()
    {
        var reason = new Microsoft.AspNetCore.Connections.ConnectionAbortedException("The Linux transport's event loop stopped.");
        foreach (var connection in _connections.ToArray())
        {
            connection.AbortOnLoop(reason);
        }

        // AbortOnLoop closed and unregistered each one (and counted it out of the meter).
        _connections.Clear();
        _metrics.Retire(this);
        foreach (var registration in _listeners)
        {
            registration.Added.TrySetResult();
            registration.Removed.TrySetResult();
        }

        _listeners.Clear();
        LibC.CloseFd(_eventFd);
        LibC.CloseFd(_epollFd);
        Engine.Dispose();

        // Continuations that arrive from now on find no loop; they only touch closed connections,
        // and the thread pool runs them so that pipes still complete.
        Volatile.Write(ref _exited, true);
        DrainToThreadPool();

        Pool.Dispose();
        TransportLog.LoopStopped(_logger, Index);
        _stopped.TrySetResult();
    }

    /// <summary>Waits for the thread to end (from a thread other than the loop's).</summary>
    public void Join()
    {
        if (_thread.IsAlive && Thread.CurrentThread != _thread)
        {
            _thread.Join();
        }

        Debug.Assert(!_thread.IsAlive || Thread.CurrentThread == _thread);
    }
}
