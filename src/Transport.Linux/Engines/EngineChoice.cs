using Kestrel.Transport.Linux.Diagnostics;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Engines;

/// <summary>
/// Which engine each loop runs: <see cref="LinuxTransportOptions.IoBackend"/> resolved once per loop group
/// (<see cref="IoBackend.Auto"/> decided, an explicit <see cref="IoBackend.IoUring"/> checked), then one engine
/// per loop, with the fallbacks logged and counted.
/// </summary>
internal static class EngineChoice
{
    /// <summary>
    /// For the group, before its loops exist: the backend the loops should run. <see cref="IoBackend.Auto"/> is io_uring
    /// with Inline scheduling where a ring can be set up, and epoll otherwise (and with ThreadPool or Adaptive scheduling). Throws when <see cref="IoBackend.IoUring"/>
    /// was asked for and cannot be had, naming the cause.
    /// </summary>
    public static IoBackend Resolve(LinuxTransportOptions options, ILogger logger, TransportMetrics metrics)
    {
        if (!MayUseIoUring(options))
        {
            if (options.IoBackend == IoBackend.Auto)
            {
                TransportLog.AutoChoseEpoll(logger, options.ApplicationSchedulingMode);
                return IoBackend.Epoll;
            }

            return options.IoBackend;
        }

        string? unavailable = !options.Tuning.UseNativeEngine
            ? "the managed engine (UseNativeEngine off) has no io_uring path"
            : KernelFeatures.RingHere.Unavailable;
        if (unavailable is null)
        {
            if (options.IoBackend == IoBackend.Auto)
            {
                TransportLog.IoUringChosen(logger, UringEngine.SetupName(KernelFeatures.RingHere.Setup));
            }

            return IoBackend.IoUring;
        }

        if (options.IoBackend == IoBackend.IoUring)
        {
            throw Unavailable(unavailable);
        }

        TransportLog.IoUringUnavailable(logger, unavailable);
        metrics.IoUringFallbacks.Add(options.ThreadCount);
        return IoBackend.Epoll;
    }

    /// <summary>
    /// True when <paramref name="options"/>' backend may run on io_uring: <see cref="IoBackend.IoUring"/>, and
    /// <see cref="IoBackend.Auto"/> with Inline scheduling. Auto follows the measurements (docs/performance.md,
    /// "IoBackend.Auto"): with ThreadPool scheduling the pool threads send with sendmsg and io_uring measured no better
    /// than epoll; with Inline scheduling, where the loop makes every send, it measured ahead. With Adaptive scheduling the
    /// ring must be movable (COOP_TASKRUN, no SINGLE_ISSUER: UringEngine.CanChangeThreads), and its threads never
    /// retire; it measured level with epoll (0.91–1.19× epoll's CPU per request by rate), so Auto keeps epoll there too.
    /// Nothing calls io_uring_setup, not even to probe, unless this is true.
    /// </summary>
    public static bool MayUseIoUring(LinuxTransportOptions options) =>
        options.IoBackend == IoBackend.IoUring
        || (options.IoBackend == IoBackend.Auto && options.ApplicationSchedulingMode == ApplicationSchedulingMode.Inline);

    /// <summary>Loop <paramref name="loop"/>'s engine for the group's resolved <paramref name="backend"/>.</summary>
    public static IoEngine Create(IoBackend backend, LinuxTransportOptions options, int loop, ILogger logger, TransportMetrics metrics)
    {
        if (backend == IoBackend.IoUring)
        {
            // With Adaptive scheduling the loop moves to another thread when a continuation blocks it, so its ring
            // must serve several threads in turn (UringEngine.CanChangeThreads).
            bool movable = options.ApplicationSchedulingMode == ApplicationSchedulingMode.Adaptive;
            var ring = UringEngine.TryCreate(out _, out string? reason, movable);
            if (ring is not null)
            {
                return ring;
            }

            // The probe worked but this loop's ring did not (the memlock limit or the fd limit reached, say).
            if (options.IoBackend == IoBackend.IoUring)
            {
                throw Unavailable($"loop {loop}: {reason}");
            }

            TransportLog.LoopIoUringUnavailable(logger, loop, reason!);
            metrics.IoUringFallbacks.Add(1);
            backend = IoBackend.Epoll;
        }

        var engine = EpollEngine.Create(backend, options.Tuning.UseNativeEngine, out string? aioUnavailable);
        if (aioUnavailable is not null)
        {
            TransportLog.AioUnavailable(logger, loop, aioUnavailable);
            metrics.AioFallbacks.Add(1);
        }

        return engine;
    }

    private static InvalidOperationException Unavailable(string reason) => new(
        $"{nameof(LinuxTransportOptions)}.{nameof(LinuxTransportOptions.IoBackend)} is {nameof(IoBackend.IoUring)}, but io_uring is not " +
        $"available here: {reason}. Set {nameof(LinuxTransportOptions.IoBackend)} to {nameof(IoBackend.Auto)} (falls back to epoll) or " +
        $"{nameof(IoBackend.Epoll)}; docs/troubleshooting.md has the remedies.");
}
