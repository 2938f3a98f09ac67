using System.Diagnostics;
using System.IO.Pipelines;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Loop;

namespace Kestrel.Transport.Linux.Scheduling;

/// <summary>
/// A connection's application scheduler with <see cref="ApplicationSchedulingMode.Adaptive"/>: a continuation
/// scheduled on the loop's thread runs there, later in the same pass (<see cref="LoopContinuations.TryQueue"/>);
/// one scheduled anywhere else, or for a connection that blocked its loop recently, goes to the loop's
/// thread-pool dispatch queue, as with <see cref="ApplicationSchedulingMode.ThreadPool"/>.
/// </summary>
/// <remarks>
/// A connection that blocked its loop runs on the pool for a while (<see cref="Demote"/>): 1 s the first time,
/// twice as long each time after, up to <see cref="MaxDemotion"/>; so an endpoint that always blocks costs one
/// loop hand-off per connection now and then, not one per request. A loop that was taken often in the last
/// second starts its new connections on the pool (<see cref="LoopContinuations.NewConnectionsStartOnPool"/>), so that
/// short connections to such an endpoint do not cost a hand-off each either.
/// </remarks>
internal sealed class AdaptiveScheduler : PipeScheduler
{
    private static readonly long s_firstDemotion = Stopwatch.Frequency;
    private static readonly long MaxDemotion = Stopwatch.Frequency * 64;

    private readonly EventLoop _loop;
    private readonly LinuxConnection _connection;
    private readonly ThreadPoolDispatchQueue _pool;
    private long _demotedUntil;
    private long _demotion;

    public AdaptiveScheduler(EventLoop loop, LinuxConnection connection, ThreadPoolDispatchQueue pool)
    {
        _loop = loop;
        _connection = connection;
        _pool = pool;
        if (loop.Continuations is { NewConnectionsStartOnPool: true })
        {
            Demote();
        }
    }

    public override void Schedule(Action<object?> action, object? state)
    {
        if (IsDemoted || _loop.Continuations?.TryQueue(action, state, _connection) != true)
        {
            _pool.Schedule(action, state);
        }
    }

    /// <summary>True while the connection runs on the pool because it blocked its loop.</summary>
    public bool IsDemoted
    {
        get
        {
            long until = Volatile.Read(ref _demotedUntil);
            return until != 0 && Stopwatch.GetTimestamp() < until;
        }
    }

    /// <summary>Any thread (the monitor): the connection blocked its loop; returns how long it stays on the pool.</summary>
    public TimeSpan Demote()
    {
        long demotion = Volatile.Read(ref _demotion);
        demotion = demotion == 0 ? s_firstDemotion : Math.Min(demotion * 2, MaxDemotion);
        Volatile.Write(ref _demotion, demotion);
        Volatile.Write(ref _demotedUntil, Stopwatch.GetTimestamp() + demotion);
        return Stopwatch.GetElapsedTime(0, demotion);
    }
}

/// <summary>An application continuation queued to run on its connection's loop (Adaptive scheduling).</summary>
internal readonly struct Continuation(Action<object?> action, object? state, LinuxConnection connection)
{
    public LinuxConnection Connection { get; } = connection;

    public void Run() => action(state);
}
