using System.Diagnostics;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// One thread's hold on a loop, from the moment it starts running the loop's passes until it ends the loop or
/// the loop is taken from it (<see cref="TryTake"/>). With Adaptive scheduling the holder runs application
/// continuations one at a time (<see cref="BeginContinuation"/>, <see cref="EndContinuation"/>); a continuation
/// that runs too long may have the loop taken away while it runs, and then the holder, once it returns, touches
/// nothing of the loop again. A new hold is a new object, so the old holder's late writes land on its own.
/// </summary>
/// <remarks>
/// Who wins when a continuation ends just as the monitor takes the loop: both compare-exchange
/// <see cref="_started"/> from the exact start of that continuation, the holder to 0, the monitor to
/// <see cref="Taken"/>. Exactly one of them succeeds, and a taken hold stays taken (<see cref="IsTaken"/>).
/// </remarks>
internal sealed class LoopRunner(EventLoop loop)
{
    /// <summary><see cref="_started"/> once the loop has been taken from this holder.</summary>
    private const long Taken = -1;

    private long _started;
    private long _continuations;

    public EventLoop Loop { get; } = loop;

    /// <summary>The managed thread that holds the loop.</summary>
    public int ManagedThreadId { get; } = Environment.CurrentManagedThreadId;

    /// <summary>The kernel's id of that thread.</summary>
    public int ThreadId { get; } = Affinity.CurrentThreadId();

    /// <summary>True once the loop has been taken from this holder: it touches nothing of the loop again.</summary>
    public bool IsTaken => Volatile.Read(ref _started) == Taken;

    /// <summary>The connection whose continuation runs now, or ran last (the monitor names it when it takes the loop).</summary>
    public LinuxConnection? Connection { get; private set; }

    /// <summary>When the running continuation started (<see cref="Stopwatch"/> ticks); 0 when none runs.</summary>
    public long ContinuationStarted => Volatile.Read(ref _started);

    /// <summary>Continuations begun so far: the monitor sees from it whether any ran between two of its looks.</summary>
    public long Continuations => Volatile.Read(ref _continuations);

    /// <summary>
    /// Holder: a continuation of <paramref name="connection"/> starts now. The exchange is a full fence, so the
    /// loop's state this thread wrote before is visible to whoever takes the loop while the continuation runs.
    /// </summary>
    public long BeginContinuation(LinuxConnection? connection)
    {
        Connection = connection;
        Volatile.Write(ref _continuations, _continuations + 1);
        long now = Stopwatch.GetTimestamp();
        Interlocked.Exchange(ref _started, now);
        return now;
    }

    /// <summary>
    /// Holder: the continuation that <see cref="BeginContinuation"/> said began at <paramref name="started"/> returned.
    /// False when the loop was taken meanwhile: this thread holds it no longer.
    /// </summary>
    public bool EndContinuation(long started) => Interlocked.CompareExchange(ref _started, 0, started) == started;

    /// <summary>
    /// Holder, leaving the loop after an exception: true when it still holds it, and from now on no continuation reads as
    /// running, so the monitor cannot take it; false when the loop was taken from this thread.
    /// </summary>
    public bool Leave()
    {
        long started = Volatile.Read(ref _started);
        return started == 0 || (started != Taken && Interlocked.CompareExchange(ref _started, 0, started) == started);
    }

    /// <summary>
    /// Monitor: takes the loop if the continuation that started at <paramref name="started"/> (as read from
    /// <see cref="ContinuationStarted"/>) is still running. True when it was taken: from now on nobody runs the
    /// loop's passes until the next holder starts.
    /// </summary>
    public bool TryTake(long started) => started > 0 && Interlocked.CompareExchange(ref _started, Taken, started) == started;
}
