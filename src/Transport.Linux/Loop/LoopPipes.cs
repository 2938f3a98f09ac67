using System.Buffers;
using System.IO.Pipelines;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Scheduling;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// The pipe options of one loop's connections, computed once per loop, not per connection. The transport's own side of
/// each pipe (writing input, reading output) continues on the loop, or, for output with pool sends, on the dispatch
/// batch; the application's side on the loop's application scheduler, or, with Adaptive scheduling, on the
/// connection's own <see cref="AdaptiveScheduler"/> (<see cref="For"/>). And, for its output pipes' zero-copy sends, the
/// refusals the kernel answered (<see cref="OnZeroCopyRefused"/>).
/// </summary>
internal sealed class LoopPipes
{
    private readonly EventLoop _loop;
    private readonly ThreadPoolDispatchQueue? _dispatchQueue;
    private readonly PipeScheduler _outputReaderScheduler;
    private readonly PipeOptions _input;
    private readonly PipeOptions _output;
    private int _zeroCopyRefusedLogged;

    public LoopPipes(EventLoop loop, MemoryPool<byte> pool, ThreadPoolDispatchQueue? dispatchQueue, PipeScheduler applicationScheduler)
    {
        var options = loop.Options;
        _loop = loop;
        _dispatchQueue = dispatchQueue;
        long maxRead = options.MaxReadBufferSize ?? 0;
        long maxWrite = options.MaxWriteBufferSize ?? 0;
        _input = new PipeOptions(pool, applicationScheduler, loop, maxRead, maxRead / 2, useSynchronizationContext: false);
        _outputReaderScheduler = dispatchQueue is not null && options.Tuning.SendFromThreadPool
            ? dispatchQueue.CreateSendScheduler(options.Tuning.CoalesceThreadPoolSends)
            : loop;

        // With zero-copy sends the output pipes' blocks come back only once the kernel is done with them.
        ZeroCopyPool = options.ZeroCopySendThreshold > 0 ? new ZeroCopyMemoryPool(pool) : null;
        _output = new PipeOptions(ZeroCopyPool ?? pool, _outputReaderScheduler, applicationScheduler, maxWrite, maxWrite / 2, useSynchronizationContext: false);
    }

    /// <summary>The output pipes' pool when zero-copy sends are on.</summary>
    public ZeroCopyMemoryPool? ZeroCopyPool { get; }

    /// <summary>
    /// The pipe options for a new connection: the loop's shared ones, or, with Adaptive scheduling, options whose
    /// application side is the connection's own <see cref="AdaptiveScheduler"/> (it decides per connection).
    /// </summary>
    public (PipeOptions Input, PipeOptions Output) For(LinuxConnection connection, out AdaptiveScheduler? scheduler)
    {
        if (_loop.Options.ApplicationSchedulingMode != ApplicationSchedulingMode.Adaptive)
        {
            scheduler = null;
            return (_input, _output);
        }

        scheduler = new AdaptiveScheduler(_loop, connection, _dispatchQueue!);
        return (
            new PipeOptions(_input.Pool, scheduler, _loop, _input.PauseWriterThreshold, _input.ResumeWriterThreshold, useSynchronizationContext: false),
            new PipeOptions(_output.Pool, _outputReaderScheduler, scheduler, _output.PauseWriterThreshold, _output.ResumeWriterThreshold, useSynchronizationContext: false));
    }

    /// <summary>
    /// A MSG_ZEROCOPY send of the loop's connections that the kernel refused with ENOBUFS (on the loop, or on
    /// a pool thread that sends): counted, and logged the first time for this loop.
    /// </summary>
    public void OnZeroCopyRefused()
    {
        _loop.Metrics.ZeroCopyRefusals.Add(1);
        if (Interlocked.Exchange(ref _zeroCopyRefusedLogged, 1) == 0)
        {
            TransportLog.ZeroCopyRefused(_loop.Logger, _loop.Index);
        }
    }
}
