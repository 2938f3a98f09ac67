using System.Net;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Diagnostics;

/// <summary>Every log message of the transport, source-generated, under one category.</summary>
internal static partial class TransportLog
{
    public const string Category = "Kestrel.Transport.Linux";

    [LoggerMessage(1, LogLevel.Information, "UseLinuxTransport() has no effect: {Reason}. Kestrel stays on the Sockets transport.")]
    public static partial void TransportOff(ILogger logger, string reason);

    [LoggerMessage(2, LogLevel.Debug, "Started {ThreadCount} event loops, scheduling {SchedulingMode}, {Engine} I/O engine.")]
    public static partial void LoopsStarted(ILogger logger, int threadCount, ApplicationSchedulingMode schedulingMode, string engine);

    [LoggerMessage(3, LogLevel.Debug, "Loop {Loop} running: {Engine} engine, Linux AIO batches {Aio}.")]
    public static partial void LoopStarted(ILogger logger, int loop, string engine, bool aio);

    [LoggerMessage(4, LogLevel.Debug, "Loop {Loop} stopped.")]
    public static partial void LoopStopped(ILogger logger, int loop);

    [LoggerMessage(5, LogLevel.Warning, "Loop {Loop}: Linux AIO is unavailable, using readv and sendmsg instead: {Reason}.")]
    public static partial void AioUnavailable(ILogger logger, int loop, string reason);

    [LoggerMessage(6, LogLevel.Debug, "Bound {EndPoint} on {Loops} loops ({Mode}).")]
    public static partial void Bound(ILogger logger, EndPoint endPoint, int loops, string mode);

    [LoggerMessage(7, LogLevel.Warning, "Loop {Loop}: accept on {EndPoint} failed: {Error}. Retrying in {BackoffMs} ms.")]
    public static partial void AcceptFailed(ILogger logger, int loop, EndPoint endPoint, string error, int backoffMs);

    [LoggerMessage(8, LogLevel.Error, "Loop {Loop}: registering the listener for {EndPoint} with its engine failed: {Error}. The bind fails.")]
    public static partial void ListenerRegistrationFailed(ILogger logger, int loop, EndPoint endPoint, string error);

    [LoggerMessage(40, LogLevel.Warning, "Unbinding {EndPoint} timed out: loop {Loops} is held by application code and has not let go of the listening socket yet. Kestrel stops accepting on it now; the socket closes when the loop lets go.")]
    public static partial void UnbindTimedOut(ILogger logger, EndPoint endPoint, string loops);

    [LoggerMessage(9, LogLevel.Error, "Connection {ConnectionId} faulted and was reset; its loop goes on.")]
    public static partial void ConnectionFault(ILogger logger, string connectionId, Exception exception);

    [LoggerMessage(10, LogLevel.Error, "Loop {Loop}: a queued continuation threw; the loop goes on.")]
    public static partial void ScheduledWorkFailed(ILogger logger, int loop, Exception exception);

    [LoggerMessage(11, LogLevel.Critical, "Loop {Loop} failed and stopped; its connections were reset.")]
    public static partial void LoopFailed(ILogger logger, int loop, Exception exception);

    [LoggerMessage(12, LogLevel.Warning, "Could not delete the Unix socket file {Path}.")]
    public static partial void UnixSocketCleanupFailed(ILogger logger, string path, Exception exception);

    [LoggerMessage(13, LogLevel.Information, "Kestrel.Transport.Linux on {Kernel}: {Features}.")]
    public static partial void Features(ILogger logger, string kernel, KernelFeatures features);

    [LoggerMessage(14, LogLevel.Warning, "SO_REUSEPORT is not available: {EndPoint} is bound once and every loop polls that socket with EPOLLEXCLUSIVE.")]
    public static partial void NoReusePort(ILogger logger, EndPoint endPoint);

    [LoggerMessage(15, LogLevel.Warning, "{Option} could not be applied on {Target}: {Error}. The transport goes on without it.")]
    public static partial void OptionNotApplied(ILogger logger, string option, string target, string error);

    [LoggerMessage(16, LogLevel.Debug, "Loop {Loop} pinned to CPU {Cpu}.")]
    public static partial void LoopPinned(ILogger logger, int loop, int cpu);

    [LoggerMessage(17, LogLevel.Information, "Loop {Loop}: the kernel refused a zero-copy send (ENOBUFS: over net.core.optmem_max or, without CAP_IPC_LOCK, over RLIMIT_MEMLOCK; ENOMEM from io_uring: over RLIMIT_MEMLOCK without CAP_IPC_LOCK); such a send goes out again by copying. Logged once per loop; kestrel.transport.linux.zerocopy.refused counts them all.")]
    public static partial void ZeroCopyRefused(ILogger logger, int loop);

    [LoggerMessage(18, LogLevel.Information, "IoBackend=Auto: the loops run on io_uring ({Setup}): with Inline scheduling it measured ahead of epoll.")]
    public static partial void IoUringChosen(ILogger logger, string setup);

    [LoggerMessage(19, LogLevel.Warning, "IoBackend=Auto: io_uring is not available here, so the loops run on epoll: {Reason}. kestrel.transport.linux.io_uring.fallbacks counts such loops; docs/troubleshooting.md has the remedies.")]
    public static partial void IoUringUnavailable(ILogger logger, string reason);

    [LoggerMessage(20, LogLevel.Warning, "Loop {Loop}: io_uring is not available for this loop, so it runs on epoll: {Reason}.")]
    public static partial void LoopIoUringUnavailable(ILogger logger, int loop, string reason);

    [LoggerMessage(21, LogLevel.Information, "IoBackend=Auto: the loops run on epoll with {SchedulingMode} scheduling: with ThreadPool scheduling io_uring measured no better than epoll, and with Adaptive scheduling a ring that can follow its loop to another thread measured level with epoll (docs/performance.md).")]
    public static partial void AutoChoseEpoll(ILogger logger, ApplicationSchedulingMode schedulingMode);

    /// <summary>
    /// Logged by the monitor as it takes the loop, so that a handler that never returns is named too: at Warning, or at
    /// Debug for compute that was mostly the JIT's (a cold start, an endpoint's first call).
    /// </summary>
    [LoggerMessage(EventId = 22, Message = "Connection {ConnectionId} ({RemoteEndPoint} to {LocalEndPoint}) has held the thread of loop {Loop} for {Milliseconds:F1} ms inside application code, {Doing}. The loop moved to another thread, and this connection runs on the thread pool until a while after that code returns. Kestrel's TraceIdentifier of each HTTP/1.1 request on this connection begins with the connection id. {Skipped} more such cases since the last message; kestrel.transport.linux.loop.handoffs counts them all, by endpoint and reason.")]
    public static partial void ContinuationBlockedLoop(ILogger logger, LogLevel level, string connectionId, EndPoint? remoteEndPoint, EndPoint? localEndPoint, int loop, double milliseconds, string doing, int skipped);

    [LoggerMessage(23, LogLevel.Warning, "Loop {Loop} is held by application code that blocks or computes, but its thread cannot be handed off: the {Threads} threads the loops may use are at their ceiling. The loop waits until that code returns or a thread frees up. {Skipped} more such cases since the last message; kestrel.transport.linux.loop.handoffs.refused counts them all.")]
    public static partial void NoThreadForBlockedLoop(ILogger logger, int loop, int threads, int skipped);

    [LoggerMessage(24, LogLevel.Warning, "Loop {Loop} spent {Milliseconds:F1} ms in one pass, scheduling {SchedulingMode}: every connection of the loop waited that long. With Inline scheduling application code runs inside the pass, so a blocking call or long computation there does this; Adaptive scheduling moves such code off the loop. {Skipped} more such passes since the last message; kestrel.transport.linux.loop.long_passes counts them all.")]
    public static partial void LongPass(ILogger logger, int loop, double milliseconds, ApplicationSchedulingMode schedulingMode, int skipped);

    [LoggerMessage(25, LogLevel.Information, "Kestrel.Transport.Linux is serving {EndPoints} on {ThreadCount} event loops: {Engine} engine, {SchedulingMode} scheduling.")]
    public static partial void Serving(ILogger logger, string endPoints, int threadCount, string engine, ApplicationSchedulingMode schedulingMode);

    [LoggerMessage(27, LogLevel.Debug, "Connection {ConnectionId} returned from the application code that held loop {Loop}'s thread, after {Milliseconds:F1} ms in all; its thread now waits to take over a loop, or exits.")]
    public static partial void ContinuationReturned(ILogger logger, string connectionId, int loop, double milliseconds);

    [LoggerMessage(28, LogLevel.Warning, "Loop {Loop} is held by application code that blocks or computes, but a thread to take it over could not start ({Threads} threads run the loops now): the loop waits until that code returns. {Skipped} more such cases since the last message; kestrel.transport.linux.loop.handoffs.refused counts them all.")]
    public static partial void ThreadStartFailed(ILogger logger, int loop, int threads, int skipped, Exception? exception);

    [LoggerMessage(29, LogLevel.Warning, "ApplicationSchedulingMode is Adaptive, but the threads' state cannot be read here ({Reason}; gVisor, a masked /proc and WSL1 hide /proc/self/task/TID/stat and schedstat): without it a loop held by blocking application code could never be moved to another thread, so the loops schedule application code as ThreadPool does.")]
    public static partial void ThreadStatsUnreadable(ILogger logger, string reason);

    [LoggerMessage(30, LogLevel.Warning, "Loop {Loop} did not stop within {Seconds} s: its thread is inside application code that has not returned, and no other thread could take the loop over. The stop goes on without it; the loop ends, and closes its connections, once that code returns.")]
    public static partial void LoopStuckAtStop(ILogger logger, int loop, int seconds);

    [LoggerMessage(31, LogLevel.Error, "The Adaptive scheduling monitor ran into an error in one look at the loops; it goes on.")]
    public static partial void MonitorLookFailed(ILogger logger, Exception exception);

    [LoggerMessage(26, LogLevel.Warning, "Loop {Loop} stopped while the kernel still held zero-copy sends of {Connections} connection(s): their sockets are closed, and their {Blocks} memory block(s) are kept out of the pool for the rest of the process rather than reused while a network device may still send from them.")]
    public static partial void ZeroCopyAbandoned(ILogger logger, int loop, int blocks, int connections);
}
