using System.Net;
using Microsoft.Extensions.Logging;

namespace LibuvComparator.Internal;

/// <summary>Every log message of the comparator, source-generated, under one category.</summary>
internal static partial class ComparatorLog
{
    public const string Category = "LibuvComparator";

    [LoggerMessage(1, LogLevel.Information, "Started {ThreadCount} libuv loops on libuv {Version}.")]
    public static partial void LoopsStarted(ILogger logger, int threadCount, string version);

    [LoggerMessage(2, LogLevel.Debug, "Bound {EndPoint}: one SO_REUSEPORT listener on each of {Loops} loops.")]
    public static partial void Bound(ILogger logger, EndPoint endPoint, int loops);

    [LoggerMessage(3, LogLevel.Warning, "Loop {Loop}: accepting on {EndPoint} failed: {Error}.")]
    public static partial void AcceptFailed(ILogger logger, int loop, EndPoint endPoint, string error);

    [LoggerMessage(4, LogLevel.Error, "Connection {ConnectionId} faulted in a libuv callback and was reset; its loop goes on.")]
    public static partial void ConnectionFault(ILogger logger, string connectionId, Exception exception);

    [LoggerMessage(5, LogLevel.Error, "Loop {Loop}: a libuv callback threw; the loop goes on.")]
    public static partial void CallbackFailed(ILogger logger, int loop, Exception exception);

    [LoggerMessage(6, LogLevel.Debug, "Loop {Loop} stopped.")]
    public static partial void LoopStopped(ILogger logger, int loop);

    [LoggerMessage(7, LogLevel.Critical, "Loop {Loop}: uv_run failed; the loop stopped.")]
    public static partial void LoopFailed(ILogger logger, int loop, Exception exception);

    [LoggerMessage(8, LogLevel.Warning, "Loop {Loop}: uv_loop_close reported {Error}; the loop's memory is leaked rather than freed under live handles.")]
    public static partial void LoopCloseFailed(ILogger logger, int loop, string error);
}
