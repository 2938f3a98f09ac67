using System.Diagnostics;
using Kestrel.Transport.Linux.Engines;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// How a loop with nothing to do waits: it polls its engine for a short window before it blocks, and only while
/// recent history says work comes within that window. A poll that finds work saves a sleep and a wake-up (on a VM
/// whose idle vCPU halts, tens of microseconds of latency and several of CPU); a poll that finds nothing is CPU spent
/// for nothing. Loop thread only.
/// </summary>
/// <remarks>
/// <para>The window follows Linux's <c>cpuidle-haltpoll</c> governor (<c>guest_halt_poll_ns</c>): after a sleep
/// that ended within the cap, a longer window would have caught the work, so the window grows (doubling, from a
/// start value); after a sleep longer than the cap it shrinks (halving, to nothing). A poll that finds work leaves
/// it as it is.</para>
/// <para>Unlike a guest's idle loop, every poll here is CPU time this process pays for, so the cap is short, and a
/// budget bounds the polls: while the loop has spent more than <see cref="Hosting.TransportTuning.IdlePollBudgetPercent"/>
/// of its working time polling, recently, the window does not grow and shrinks after every miss. Requests that come
/// farther apart than the cap, at the loads where CPU matters most, are never polled for.</para>
/// <para><see cref="LinuxTransportOptions.SpinBeforeSleepMicroseconds"/> overrides it with a fixed window.</para>
/// </remarks>
internal sealed class IdlePoll
{
    /// <summary>Recent time is what counts for the budget: the sums halve every this many ticks (about 100 ms).</summary>
    private static readonly long s_decayTicks = Stopwatch.Frequency / 10;

    private readonly IoEngine _engine;
    private readonly Func<bool> _hasWork;
    private readonly long _fixedTicks;
    private readonly long _capTicks;
    private readonly long _startTicks;
    private readonly int _budgetPercent;

    private long _window;
    private long _polled;
    private long _worked;
    private long _decayAt;
    private long _wokeAt;

    public IdlePoll(IoEngine engine, LinuxTransportOptions options, Func<bool> hasWork)
    {
        _engine = engine;
        _hasWork = hasWork;
        _fixedTicks = options.SpinBeforeSleepMicroseconds * Stopwatch.Frequency / 1_000_000;
        _capTicks = options.Tuning.IdlePollMaxMicroseconds * Stopwatch.Frequency / 1_000_000;
        _startTicks = Math.Min(_capTicks, Math.Max(1, _capTicks / 4));
        _budgetPercent = options.Tuning.IdlePollBudgetPercent;
    }

    /// <summary>The current window in microseconds (tests and diagnostics).</summary>
    public double WindowMicroseconds => _window * 1e6 / Stopwatch.Frequency;

    /// <summary>
    /// Waits for events, for at most <paramref name="timeout"/> ms (-1: no limit), polling first while that pays.
    /// The loop has already said it may sleep (<see cref="LoopWakeup.EnterWait"/>), so work posted during the poll
    /// also signals the engine: nothing can be missed.
    /// </summary>
    public int Wait(int timeout)
    {
        if (_fixedTicks == 0 && _capTicks == 0)
        {
            return _engine.Wait(timeout); // never polls: no clock to read
        }

        long start = Stopwatch.GetTimestamp();
        if (_wokeAt != 0)
        {
            _worked += start - _wokeAt;
        }

        if (start >= _decayAt)
        {
            _polled /= 2;
            _worked /= 2;
            _decayAt = start + s_decayTicks;
        }

        long window = _fixedTicks > 0 ? _fixedTicks : OverBudget ? 0 : _window;
        int count;
        if (window > 0)
        {
            long end = start + window;
            long now;
            do
            {
                count = _engine.Wait(0);
                now = Stopwatch.GetTimestamp();
                if (count != 0 || _hasWork())
                {
                    _polled += now - start;
                    _wokeAt = now;
                    return count;
                }
            }
            while (now < end);

            _polled += now - start;
        }

        count = _engine.Wait(timeout);
        long woke = Stopwatch.GetTimestamp();
        _wokeAt = woke;
        if (_fixedTicks == 0 && _capTicks > 0)
        {
            Adjust(woke - start);
        }

        return count;
    }

    /// <summary>True while recent polls took more than the budget's share of the loop's working time.</summary>
    private bool OverBudget => _polled * 100 > _worked * _budgetPercent;

    /// <summary>After a sleep (after a poll that found nothing, or none), which lasted <paramref name="idle"/> in all.</summary>
    private void Adjust(long idle)
    {
        if (idle <= _capTicks && !OverBudget)
        {
            _window = Math.Min(_capTicks, Math.Max(_startTicks, _window * 2));
        }
        else if (_window > 0)
        {
            _window = _window / 2 < _startTicks / 2 ? 0 : _window / 2;
        }
    }
}
