using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Loop;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Hosting;

/// <summary>
/// The loop threads of one server, shared by all of its endpoints. Created by the first bind;
/// each listener holds a reference, and the loops stop when the last one is released and their
/// connections have closed.
/// </summary>
internal sealed class EventLoopGroup
{
    // The owner Kestrel's Sockets transport gives its pools, so the aspnetcore.memory_pool.* instruments (tagged
    // aspnetcore.memory_pool.owner) count this transport's memory where dashboards already look for Kestrel's.
    private static readonly MemoryPoolOptions s_poolOptions = new() { Owner = "kestrel" };

    private readonly EventLoop[] _loops;
    private readonly LoopMonitor? _monitor;
    private int _references;

    public EventLoopGroup(LinuxTransportOptions options, IMemoryPoolFactory<byte> poolFactory, ILogger logger, TransportMetrics metrics)
    {
        var backend = EngineChoice.Resolve(options, logger, metrics);
        _monitor = options.ApplicationSchedulingMode == ApplicationSchedulingMode.Adaptive ? new LoopMonitor(options, logger) : null;
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

        _monitor?.Start();
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

        await Task.WhenAll(_loops.Select(static l => l.Stopped));
        _monitor?.Dispose();
        foreach (var loop in _loops)
        {
            loop.Join();
        }
    }
}
