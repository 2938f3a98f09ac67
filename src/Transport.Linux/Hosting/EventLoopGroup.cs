using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Loop;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Hosting;

/// <summary>
/// The loop threads of one server, shared by all of its endpoints. Created by the first bind;
/// each listener holds a reference, and the loops stop when the last one is released and their
/// connections have closed. With Adaptive scheduling the group's monitor, and every standby thread, end
/// with its loops (a bind after that starts a new group).
/// </summary>
[System.Diagnostics.CodeAnalysis.SuppressMessage("Design", "CA1001", Justification = "The monitor ends with the loops (End), when a release or a stop has stopped them, not when the group is dropped.")]
internal sealed class EventLoopGroup
{
    /// <summary>
    /// How long <see cref="StopAsync"/> waits for the loops (5 s): an aborting stop takes at most the 2 s zero-copy wait of
    /// <see cref="LoopConnections.ZeroCopyStopWaitMs"/>, unless application code holds a loop that no thread could take over.
    /// </summary>
    private static readonly TimeSpan s_stopWait = TimeSpan.FromSeconds(5);

    // The owner Kestrel's Sockets transport gives its pools, so the aspnetcore.memory_pool.* instruments (tagged
    // aspnetcore.memory_pool.owner) count this transport's memory where dashboards already look for Kestrel's.
    private static readonly MemoryPoolOptions s_poolOptions = new() { Owner = "kestrel" };

    private readonly EventLoop[] _loops;
    private readonly LoopMonitor? _monitor;
    private readonly TransportMetrics _metrics;
    private readonly ILogger _logger;
    private int _references;
    private int _ended;

    public EventLoopGroup(LinuxTransportOptions options, IMemoryPoolFactory<byte> poolFactory, ILogger logger, TransportMetrics metrics)
    {
        var backend = EngineChoice.Resolve(options, logger, metrics);
        _metrics = metrics;
        _logger = logger;

        // Adaptive scheduling runs application code on the loops only where the monitor can see a holder asleep in the
        // kernel; elsewhere the loops schedule as ThreadPool does (no monitor: EventLoop), and say so.
        if (options.ApplicationSchedulingMode == ApplicationSchedulingMode.Adaptive)
        {
            if (HolderStats.CanRead(options.Tuning.ThreadStatsDirectory, out string reason))
            {
                _monitor = new LoopMonitor(options, logger, metrics);
            }
            else
            {
                TransportLog.ThreadStatsUnreadable(logger, reason);
            }
        }

        _loops = new EventLoop[options.ThreadCount];
        try
        {
            for (int i = 0; i < _loops.Length; i++)
            {
                var pool = poolFactory.Create(s_poolOptions);
                _loops[i] = new EventLoop(i, options, backend, pool, logger, metrics, _monitor);
                _monitor?.Add(_loops[i]);
            }
        }
        catch
        {
            foreach (var loop in _loops)
            {
                loop?.Start();
                loop?.Stop(abortConnections: true);
            }

            throw;
        }

        if (_loops.Any(static l => l.RunsContinuations && l.Engine.Backend == IoBackend.IoUring))
        {
            _monitor!.Threads.KeepEveryThread();
        }

        foreach (var loop in _loops)
        {
            loop.Start();
        }

        if (_monitor is not null)
        {
            metrics.Add(_monitor.Threads);
            _monitor.Start();
        }
    }

    /// <summary>The threads that hold the loops with Adaptive scheduling (diagnostics and tests); null otherwise.</summary>
    public LoopThreads? Threads => _monitor?.Threads;

    public IReadOnlyList<EventLoop> Loops => _loops;

    /// <summary>Takes a reference; false when the group is already stopping.</summary>
    public bool TryAcquire()
    {
        int current;
        do
        {
            current = Volatile.Read(ref _references);
            if (current < 0)
            {
                return false;
            }
        }
        while (Interlocked.CompareExchange(ref _references, current + 1, current) != current);
        return true;
    }

    /// <summary>Drops a reference; the last one stops the loops once their connections have closed.</summary>
    public void Release()
    {
        if (Interlocked.Decrement(ref _references) == 0 && Interlocked.CompareExchange(ref _references, -1, 0) == 0)
        {
            foreach (var loop in _loops)
            {
                loop.Stop(abortConnections: false);
            }

            // The monitor watches the loops until their connections have closed; then it and the standbys end.
            Task.WhenAll(_loops.Select(static l => l.Stopped)).ContinueWith(static (_, g) => ((EventLoopGroup)g!).End(), this, CancellationToken.None, TaskContinuationOptions.None, TaskScheduler.Default);
        }
    }

    /// <summary>Stops every loop now, resetting what is still open, and waits for the threads.</summary>
    public async Task StopAsync()
    {
        Volatile.Write(ref _references, -1);
        foreach (var loop in _loops)
        {
            loop.Stop(abortConnections: true);
        }

        // A loop held by application code that never returns, which no thread could take over (Thread.Start failing,
        // say), does not hold up the stop: it is logged, and ends by itself once that code returns.
        var stopped = Task.WhenAll(_loops.Select(static l => l.Stopped));
        await Task.WhenAny(stopped, Task.Delay(s_stopWait));
        End();
        foreach (var loop in _loops)
        {
            if (loop.Stopped.IsCompleted)
            {
                loop.Join();
            }
            else
            {
                TransportLog.LoopStuckAtStop(_logger, loop.Index, (int)s_stopWait.TotalSeconds);
            }
        }
    }

    /// <summary>The loops have stopped (or a stop gave up on them): the monitor's thread and the standbys exit.</summary>
    private void End()
    {
        if (_monitor is not null && Interlocked.Exchange(ref _ended, 1) == 0)
        {
            _monitor.Dispose();
            _metrics.Remove(_monitor.Threads);
        }
    }
}
