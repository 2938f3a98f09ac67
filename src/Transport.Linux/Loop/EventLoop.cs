using System.Buffers;
using System.Diagnostics;
using System.IO.Pipelines;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Listening;
using Kestrel.Transport.Linux.Scheduling;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// An I/O engine and the passes that drive it. Each pass (<see cref="RunPasses"/>): wait for events, accept,
/// receive every readable socket in one batch, run the application's continuations queued to this loop
/// (Adaptive scheduling), run the transport's own queued work, then send everything that was flushed during
/// the pass in one batch. Connections never leave the loop that accepted them.
/// </summary>
/// <remarks>
/// <para><b>The loop's thread.</b> One thread at a time holds the loop (<see cref="LoopRunner"/>) and runs its
/// passes; everything the remarks of <see cref="LinuxConnection"/> call "the loop thread" means that holder.
/// With ThreadPool and Inline scheduling it is always the thread the loop started on. With Adaptive scheduling
/// on an engine that may change threads (<see cref="IoEngine.CanChangeThreads"/>), the <see cref="LoopMonitor"/>
/// may take the loop from a holder whose application continuation has run too long, and hand it to another
/// thread (<see cref="LoopThreads"/>), which goes on with the next pass. That can happen only while the holder
/// runs one of those continuations (<see cref="LoopContinuations.Run"/>), never in the middle of the loop's own code;
/// once the continuation returns, the old holder leaves without touching the loop again.</para>
/// <para>Other threads reach the loop only through <see cref="Schedule"/>/<see cref="Post"/> (<see cref="LoopInbox"/>),
/// the wake-up protocol (<see cref="LoopWakeup"/>) and the send lock (<see cref="SendSide.Lock"/>). Which thread holds the
/// loop, and the monitor's take, are <see cref="LoopHold"/>'s.</para>
/// </remarks>
internal sealed class EventLoop : PipeScheduler
{
    /// <summary>While a dispatch batch is queued or running the loop waits at most this long (see <see cref="ComputeTimeout"/>).</summary>
    private const int DispatchPollMs = 1;

    /// <summary>A pass that takes longer than this (50 ms) is counted and logged as a long one: something held the loop's thread.</summary>
    private static readonly long s_longPass = Stopwatch.Frequency / 20;

    private readonly ThreadPoolDispatchQueue? _dispatchQueue;
    private readonly LoopWakeup _wakeup;
    private readonly Acceptor _acceptor;
    private readonly Thread _thread;
    private readonly LoopInbox _inbox;
    private readonly TaskCompletionSource _stopped = new(TaskCreationOptions.RunContinuationsAsynchronously);
    private readonly LoopConnections _connections;
    private readonly PassBatches _batches;

    /// <summary>How the loop waits when it has nothing to do: a poll first, while polls pay.</summary>
    private readonly IdlePoll _idle;

    private readonly LoopHold _hold;
    private bool _engineStarted;

    // When the current pass began (0 while the loop waits), for the long-pass count and the meter's gauge; at most
    // one long-pass warning per 10 s.
    private long _passStarted;
    private readonly RateLimitedLog _longPassLog = new(TimeSpan.FromSeconds(10));

    // Totals read by the meter's observable instruments (the bytes of the pass batches are theirs).
    private long _passCount;
    private long _bytesSentOffLoop;

    public EventLoop(int index, LinuxTransportOptions options, IoBackend backend, MemoryPool<byte> pool, ILogger logger, TransportMetrics metrics, LoopMonitor? monitor = null)
    {
        Index = index;
        Options = options;
        Logger = logger;
        Metrics = metrics;
        Pool = pool;

        _hold = new LoopHold(this);
        Engine = EngineChoice.Create(backend, options, index, logger, metrics);
        _wakeup = new LoopWakeup(Engine);
        SocketOptions = new AcceptedSocketOptions(options, logger, index);
        _acceptor = new Acceptor(this, SocketOptions);
        _connections = new LoopConnections(this);
        _batches = new PassBatches(Engine, metrics, deferSends: options.Tuning.DeferSend);

        _dispatchQueue = options.ApplicationSchedulingMode == ApplicationSchedulingMode.Inline ? null : new ThreadPoolDispatchQueue(this, _wakeup);
        _inbox = new LoopInbox(this, _wakeup, _dispatchQueue);
        _idle = new IdlePoll(Engine, options, () => !_inbox.IsEmpty || HasContinuations, () => _batches.BytesReceived);
        ApplicationScheduler = (PipeScheduler?)_dispatchQueue ?? Inline;

        // Adaptive scheduling runs continuations here only where the loop can move to another thread when one
        // blocks: with a monitor to see it, and an engine that does not belong to one thread. Elsewhere its
        // connections schedule as ThreadPool does.
        if (options.ApplicationSchedulingMode == ApplicationSchedulingMode.Adaptive && monitor is not null && Engine.CanChangeThreads)
        {
            Continuations = new LoopContinuations(this, monitor, _wakeup);
        }

        _pipes = new LoopPipes(this, pool, _dispatchQueue, ApplicationScheduler);

        if (options.BusyPollMicroseconds > 0)
        {
            var result = Engine.SetBusyPoll((uint)options.BusyPollMicroseconds);
            if (result.IsError)
            {
                TransportLog.OptionNotApplied(logger, "epoll busy-poll parameters (EPIOCSPARAMS)", $"loop {index}", Errno.Describe(result.Error));
            }
        }

        MetricTag = new KeyValuePair<string, object?>(TransportMetrics.LoopTag, index);
        _thread = new Thread(Run) { IsBackground = true, Name = ThreadName };
        metrics.Add(this);
    }

    private readonly LoopPipes _pipes;

    public int Index { get; }

    /// <summary>The name of the thread that holds the loop.</summary>
    public string ThreadName => $"Kestrel Linux loop {Index}";

    public LinuxTransportOptions Options { get; }

    public ILogger Logger { get; }

    public TransportMetrics Metrics { get; }

    public MemoryPool<byte> Pool { get; }

    public IoEngine Engine { get; }

    public PipeScheduler ApplicationScheduler { get; }

    /// <summary>The output pipes' pool when zero-copy sends are on (its count of outstanding blocks is for tests and diagnostics).</summary>
    public ZeroCopyMemoryPool? ZeroCopyPool => _pipes.ZeroCopyPool;

    /// <summary>What this loop sets on accepted sockets, and so what its connections may count on.</summary>
    public AcceptedSocketOptions SocketOptions { get; }

    /// <summary>The kernel's id of the loop thread (0 until it runs).</summary>
    public int ThreadId => _hold.ThreadId;

    public long PassCount => Volatile.Read(ref _passCount);

    /// <summary>How long the loop has been inside its current pass (zero while it waits for events): the meter's view of a blocked loop.</summary>
    public TimeSpan CurrentPassDuration
    {
        get
        {
            long started = Volatile.Read(ref _passStarted);
            return started == 0 ? TimeSpan.Zero : Stopwatch.GetElapsedTime(started);
        }
    }

    /// <summary>The meter's tag for this loop.</summary>
    public KeyValuePair<string, object?> MetricTag { get; }

    public long BytesReceived => _batches.BytesReceived;

    public long BytesSent => _batches.BytesSent + Volatile.Read(ref _bytesSentOffLoop);

    /// <summary>Completes when the thread has exited and every fd it owned is closed.</summary>
    public Task Stopped => _stopped.Task;

    /// <summary>True on the thread that holds this loop now (see the remarks).</summary>
    public bool IsLoopThread => _hold.IsCurrentThread;

    /// <summary>Adaptive scheduling's application continuations on this loop; null where they go to the pool (another mode, or an engine that cannot change threads).</summary>
    public LoopContinuations? Continuations { get; }

    /// <summary>True when application continuations run on this loop's thread while they are quick (Adaptive scheduling).</summary>
    public bool RunsContinuations => Continuations is not null;

    /// <summary>The current hold on the loop (the monitor's view); null before the loop starts and between a take and the next holder.</summary>
    public LoopRunner? Runner => _hold.Runner;

    /// <summary>True while work that only this loop can do, and that a stop or an unbind waits for, is queued (<see cref="LoopInbox.HasControlWork"/>).</summary>
    public bool HasControlWork => _inbox.HasControlWork;

    public void Start()
    {
        Continuations?.Monitor.Threads.Joining();
        _thread.Start();
    }

    /// <summary>The pipe options for a new connection (<see cref="LoopPipes.For"/>).</summary>
    public (PipeOptions Input, PipeOptions Output) PipeOptionsFor(LinuxConnection connection, out AdaptiveScheduler? scheduler)
        => _pipes.For(connection, out scheduler);

    /// <summary>
    /// Asks the loop to end: at once when <paramref name="abortConnections"/> (connections are reset),
    /// otherwise once its last listener is gone and its last connection has closed.
    /// </summary>
    public void Stop(bool abortConnections) => _inbox.PostControl(static s =>
    {
        var (loop, abort) = ((EventLoop, bool))s!;
        loop._connections.RequestStop(abort);
    }, (this, abortConnections));

    /// <summary>Runs <paramref name="action"/> on this loop's thread during its next pass.</summary>
    public override void Schedule(Action<object?> action, object? state) => _inbox.Post(action, state);

    public void Post(Action<object?> action, object? state) => _inbox.Post(action, state);

    public void AddListener(ListenRegistration registration) => _inbox.PostControl(static s =>
    {
        var r = (ListenRegistration)s!;
        var loop = r.Loop;
        if (loop._connections.Aborting)
        {
            r.Added.TrySetResult();
            return;
        }

        loop._acceptor.Add(r);
    }, registration);

    public void RemoveListener(ListenRegistration registration)
        => _inbox.PostControl(static s => ((ListenRegistration)s!).Loop._acceptor.Remove((ListenRegistration)s!), registration);

    /// <summary>Queues a receive for this pass's receive batch (loop thread only).</summary>
    public void QueueReceive(IBatchOwner receive) => _batches.QueueReceive(receive);

    /// <summary>Queues a send for the end of this pass (loop thread only).</summary>
    public void QueueSend(IBatchOwner send) => _batches.QueueSend(send);

    /// <summary>A new connection of this loop (loop thread only): see <see cref="LoopConnections.Register"/>.</summary>
    public void Register(LinuxConnection connection) => _connections.Register(connection);

    /// <summary>Forgets a connection and closes its socket (loop thread only): see <see cref="LoopConnections.Close"/>.</summary>
    public void Close(LinuxConnection connection) => _connections.Close(connection);

    /// <summary>Counts bytes a pool thread sent for one of this loop's connections (any thread).</summary>
    public void AddBytesSentOffLoop(long bytes) => Interlocked.Add(ref _bytesSentOffLoop, bytes);

    /// <summary>A zero-copy send of this loop's connections that the kernel refused (any thread): see <see cref="LoopPipes.OnZeroCopyRefused"/>.</summary>
    public void OnZeroCopyRefused() => _pipes.OnZeroCopyRefused();

    /// <summary>Waits until the loop has ended and the thread that ended it has exited (<see cref="LoopHold.Join"/>).</summary>
    public void Join() => _hold.Join(_thread, Stopped);

    /// <summary>The loop's first thread: runs the passes, and after the loop was taken from it serves as a standby.</summary>
    private void Run() => LoopThreads.Serve(this, Continuations?.Monitor.Threads);

    /// <summary>
    /// Holds the loop and runs its passes on the calling thread: true once the loop has ended (it is shut down,
    /// and the thread should exit), false when the monitor took the loop from this thread (which then touches
    /// nothing of it again).
    /// </summary>
    internal bool RunPasses()
    {
        var runner = _hold.Begin();
        Volatile.Write(ref _passStarted, 0); // the pass the loop was taken in is over
        try
        {
            if (!_engineStarted)
            {
                _engineStarted = true;
                Engine.Start();
                TransportLog.LoopStarted(Logger, Index, Engine.Name, Engine.UsesAio);
            }
            else
            {
                // Every hold but the first begins inside a pass the monitor cut short in its continuations: finish it
                // now, so that what its continuations flushed goes out before the next one runs (and maybe blocks too).
                FinishPass(passStarted: 0);
            }

            while (true)
            {
                int timeout = ComputeTimeout(out bool polling);
                if (timeout != 0)
                {
                    // Pairs with LoopWakeup.Wake: whoever enqueues after this sees the loop waiting and signals.
                    _wakeup.EnterWait(polling);
                    if (!_inbox.IsEmpty || HasContinuations)
                    {
                        timeout = 0;
                    }
                }

                int count = timeout != 0 && !polling ? _idle.Wait(timeout) : Engine.Wait(timeout);
                _wakeup.ExitWait();
                long passStarted = Stopwatch.GetTimestamp();
                Volatile.Write(ref _passStarted, passStarted);
                Volatile.Write(ref _passCount, _passCount + 1);
                if (Metrics.EventsPerPass.Enabled)
                {
                    Metrics.EventsPerPass.Record(count);
                }

                for (int i = 0; i < count; i++)
                {
                    Dispatch(i);
                }

                _batches.RunReceives();
                if (Continuations is { } continuations && !continuations.Run(runner))
                {
                    return false;
                }

                FinishPass(passStarted);
                if (_connections.ReadyToExit(_acceptor.Count))
                {
                    break;
                }
            }
        }
        catch (Exception e)
        {
            // Only a bug in the loop itself should get here; connections' faults are caught per connection. Should the
            // loop have been taken from this thread meanwhile, another thread holds it: this one leaves it alone.
            if (!runner.Leave())
            {
                LoopMonitor.Guarded(() => TransportLog.ScheduledWorkFailed(Logger, Index, e));
                return false;
            }

            LoopMonitor.Guarded(() => TransportLog.LoopFailed(Logger, Index, e));
        }

        _hold.Ending();
        Shutdown();
        _hold.Ended();
        return true;
    }

    /// <summary>
    /// Monitor thread: takes the loop from <paramref name="runner"/> (see <see cref="LoopHold.TryTake"/>); the caller then
    /// hands it to another thread and calls <see cref="LoopContinuations.OnTaken"/>.
    /// </summary>
    internal bool TryTake(LoopRunner runner, long started) => _hold.TryTake(runner, started);

    /// <summary>
    /// The rest of a pass after its continuations: the transport's own queued work, the send batch, listeners whose
    /// backoff is over, help for a stalled dispatch batch, and the long-pass count (<paramref name="passStarted"/> 0: a
    /// pass whose start a previous holder counted).
    /// </summary>
    private void FinishPass(long passStarted)
    {
        _inbox.RunQueued();
        _batches.RunSends();
        _acceptor.RetryBackedOff();
        _dispatchQueue?.HelpIfStalled();
        if (passStarted != 0)
        {
            EndPass(passStarted);
        }
    }

    /// <summary>
    /// The end of a pass: one that took longer than <see cref="s_longPass"/> is counted, and logged at most once per
    /// 10 s. With Inline scheduling that is the app blocking the loop; otherwise a very large batch, or a starved CPU.
    /// </summary>
    private void EndPass(long started)
    {
        Volatile.Write(ref _passStarted, 0);
        long now = Stopwatch.GetTimestamp();
        if (now - started < s_longPass)
        {
            return;
        }

        Metrics.LongPasses.Add(1, MetricTag);
        if (_longPassLog.TryEnter(now, out int skipped))
        {
            TransportLog.LongPass(Logger, Index, Stopwatch.GetElapsedTime(started, now).TotalMilliseconds, Options.ApplicationSchedulingMode, skipped);
        }
    }

    private int ComputeTimeout(out bool polling)
    {
        polling = false;
        if (_batches.HasQueued || !_inbox.IsEmpty || HasContinuations || _connections.ReadyToExit(_acceptor.Count))
        {
            return 0;
        }

        int timeout = _acceptor.MillisecondsToNextRetry;

        int left = _connections.MillisecondsToAbortDeadline();
        if (left >= 0)
        {
            timeout = timeout < 0 ? left : Math.Min(timeout, left);
        }

        // While a dispatch batch is queued or runs, its wake-up comes when the batch ends. Should the app block
        // inside the batch waiting for this loop (synchronous I/O under backpressure), a short poll keeps that
        // from turning into a deadlock, and lets HelpIfStalled look.
        if (_dispatchQueue is { IsActive: true })
        {
            timeout = timeout < 0 ? DispatchPollMs : Math.Min(timeout, DispatchPollMs);
            polling = true;
        }

        return timeout;
    }

    private bool HasContinuations => Continuations is { IsEmpty: false };

    private void Dispatch(int index)
    {
        switch (Engine.OwnerAt(index))
        {
            case LinuxConnection connection:
                connection.OnEvent(Engine, index);
                break;
            case ListenRegistration listener when Engine.AcceptsInKernel:
                _acceptor.Accepted(listener, Engine.AcceptedAt(index));
                break;
            case ListenRegistration listener:
                _acceptor.Accept(listener);
                break;
        }
    }

    private void Shutdown()
    {
        _connections.EndAll();
        Metrics.Retire(this);
        _acceptor.ReleaseAll();
        Engine.Dispose();

        // Continuations that arrive from now on find no loop; they only touch closed connections, and the
        // thread pool runs them so that pipes still complete.
        _inbox.Close();

        Pool.Dispose();
        TransportLog.LoopStopped(Logger, Index);
        _stopped.TrySetResult();
    }
}
