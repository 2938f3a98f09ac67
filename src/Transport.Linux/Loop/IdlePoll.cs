using System.Diagnostics;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// How a loop with nothing to do waits: it may poll its engine for a short window before it blocks, and does so only
/// while polling has paid on this host lately. Loop thread only.
/// </summary>
/// <remarks>
/// <para>Why poll at all. A loop that sleeps between requests pays for each wake-up twice: the kernel's switch back to
/// its thread, and the request's own code running on caches that whatever ran meanwhile (another VM, on a halted
/// vCPU) has cooled. On the 2-vCPU KVM guest the transport is measured on, a spinner that kept the vCPU from halting
/// cut the user CPU of a /json request at 25% load from 8.7 to 5.8 µs, and a 20 µs poll made two connections
/// 1.5x faster at lower CPU per request (docs/performance.md). But a poll that finds nothing is CPU spent for nothing,
/// and a loop that polls picks up each request alone, where one that slept would have found several and handled them
/// in one pass: at 16 connections polling cost 8% more CPU per request.</para>
/// <para>So the loop measures instead of guessing. It runs in epochs of <see cref="EpochTicks"/> of activity; every
/// epoch reads the thread's CPU time (one system call) and the bytes its connections received, and
/// <see cref="IdlePollChoice"/> picks the next epoch's mode from those costs: the cheaper one per byte, judged over
/// runs of epochs, with the other tried now and then. Polling wins when it costs no more (or up to
/// <see cref="Hosting.TransportTuning.IdlePollLatencyAllowancePercent"/> more: a poll also answers sooner), and never
/// while the loop is saturated. An idle loop blocks and counts nothing: no epoch, no poll, no wake-up.</para>
/// <para>Within a polling epoch the window follows Linux's <c>cpuidle-haltpoll</c> governor
/// (<c>guest_halt_poll_ns</c>): after a sleep that ended within the cap a longer window would have caught the work,
/// so it grows (doubling, from a quarter of the cap); after a sleep longer than the cap it halves, to nothing. A poll
/// that finds work leaves it as it is.</para>
/// <para><see cref="LinuxTransportOptions.SpinBeforeSleepMicroseconds"/> overrides all this with a fixed window.</para>
/// </remarks>
internal sealed class IdlePoll
{
    /// <summary>One epoch: this much time with events in it (25 ms), at least <see cref="MinEpochEvents"/> events.</summary>
    private static readonly long EpochTicks = Stopwatch.Frequency / 40;

    /// <summary>An epoch with fewer events says little about a mode's cost per event, and a loop that quiet needs no poll.</summary>
    private const int MinEpochEvents = 64;

    private readonly IoEngine _engine;
    private readonly Func<bool> _hasWork;
    private readonly Func<long> _bytesReceived;
    private readonly long _fixedTicks;
    private readonly long _capTicks;
    private readonly long _startTicks;
    private readonly IdlePollChoice _choice;

    // The window while polling (0: the next wait does not poll), and the epoch under way.
    private long _window;
    private bool _epochPolls;
    private long _epochStart;
    private long _epochCpu;
    private long _epochBytes;
    private long _epochEvents;
    private long _epochSlept;

    public IdlePoll(IoEngine engine, LinuxTransportOptions options, Func<bool> hasWork, Func<long> bytesReceived)
    {
        _engine = engine;
        _hasWork = hasWork;
        _bytesReceived = bytesReceived;
        _fixedTicks = options.SpinBeforeSleepMicroseconds * Stopwatch.Frequency / 1_000_000;

        // Polling pays only where the loop itself runs the requests (a ThreadPool loop's wake-up is a small part of one).
        bool runsRequests = options.ApplicationSchedulingMode != ApplicationSchedulingMode.ThreadPool;
        _capTicks = runsRequests ? options.Tuning.IdlePollMaxMicroseconds * Stopwatch.Frequency / 1_000_000 : 0;
        _startTicks = Math.Max(1, _capTicks / 4);
        _choice = new IdlePollChoice(options.Tuning.IdlePollLatencyAllowancePercent);
    }

    /// <summary>
    /// Waits for events, for at most <paramref name="timeout"/> ms (-1: no limit), polling first while that pays. The
    /// loop has already said it may sleep (<see cref="LoopWakeup.EnterWait"/>), so work posted during the poll also
    /// signals the engine: nothing can be missed.
    /// </summary>
    public int Wait(int timeout)
    {
        if (_fixedTicks > 0)
        {
            return PollThenWait(_fixedTicks, timeout, out _);
        }

        if (_capTicks == 0)
        {
            return _engine.Wait(timeout); // never polls: no clock to read
        }

        long start = Stopwatch.GetTimestamp();
        int count = PollThenWait(_epochPolls ? _window : 0, timeout, out long slept);
        long now = slept > 0 ? start + slept : Stopwatch.GetTimestamp();
        if (slept > 0)
        {
            _epochSlept += slept;
            if (_epochPolls)
            {
                Adjust(slept);
            }
        }

        _epochEvents += count;
        if (now - _epochStart >= EpochTicks)
        {
            EndEpoch(now);
        }

        return count;
    }

    /// <summary>Polls for up to <paramref name="window"/> ticks, then blocks; <paramref name="slept"/> is how long the whole wait took when it blocked, 0 when a poll found work.</summary>
    private int PollThenWait(long window, int timeout, out long slept)
    {
        long start = 0;
        if (window > 0)
        {
            start = Stopwatch.GetTimestamp();
            long end = start + window;
            long now;
            do
            {
                int found = _engine.Wait(0);
                if (found != 0 || _hasWork())
                {
                    slept = 0;
                    return found;
                }

                now = Stopwatch.GetTimestamp();
            }
            while (now < end);
        }
        else if (_capTicks > 0)
        {
            start = Stopwatch.GetTimestamp();
        }

        int count = _engine.Wait(timeout);
        slept = start == 0 ? 0 : Math.Max(1, Stopwatch.GetTimestamp() - start);
        return count;
    }

    /// <summary>A polling epoch's sleep of <paramref name="idle"/> ticks (after a poll that found nothing, or none).</summary>
    private void Adjust(long idle)
    {
        if (idle <= _capTicks)
        {
            _window = Math.Min(_capTicks, Math.Max(_startTicks, _window * 2));
        }
        else if (_window > 0)
        {
            _window = _window / 2 < _startTicks / 2 ? 0 : _window / 2;
        }
    }

    /// <summary>Closes the epoch: what it cost per event goes into its mode's estimate, and the next epoch's mode is chosen.</summary>
    private void EndEpoch(long now)
    {
        long cpu = LibC.ThreadCpuNanoseconds();
        long bytes = _bytesReceived();
        long elapsed = now - _epochStart;
        bool measured = _epochCpu > 0 && cpu > _epochCpu && bytes > _epochBytes && _epochEvents >= MinEpochEvents && _epochStart != 0;
        int busyPercent = (int)Math.Clamp(100 * (elapsed - _epochSlept) / Math.Max(1, elapsed), 0, 100);
        bool quiet = !measured && _epochStart != 0 && _epochEvents < MinEpochEvents;
        long epochCpu = measured ? cpu - _epochCpu : 0;
        long epochBytes = measured ? bytes - _epochBytes : 0;
        _epochStart = now;
        _epochCpu = cpu;
        _epochBytes = bytes;
        _epochEvents = 0;
        _epochSlept = 0;

        _choice.EndEpoch(epochCpu, epochBytes, busyPercent, quiet);
        bool polls = _choice.Polls;
        if (polls && !_epochPolls)
        {
            _window = _startTicks;
        }

        _epochPolls = polls;
    }
}
