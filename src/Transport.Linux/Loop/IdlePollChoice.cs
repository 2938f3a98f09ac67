namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// Which way <see cref="IdlePoll"/> waits in its next epoch, poll or sleep, from what each way has cost per byte
/// received lately. Fed one epoch at a time, with no clock of its own, so its rule can be tested on made-up costs. Loop
/// thread only.
/// </summary>
/// <remarks>
/// <para>Most epochs run the way the choice favours, the incumbent; now and then a run of <see cref="RunEpochs"/>
/// epochs explores the other way. The choice changes only at the end of a run, on the run's CPU over its bytes
/// received against the incumbent's over the epochs just before it, each older one weighing <see cref="Decay"/> as
/// much. Three things make that comparison fair:</para>
/// <list type="bullet">
/// <item>Per byte received: the work the clients sent, however the engine reports it (one event may carry several
/// pipelined requests). In the logs, at 2 connections, both ways read 45 bytes per event.</item>
/// <item>Sums over runs, not single epochs. Polling's extra cost sits in a tail of a few expensive epochs: at 5% load
/// on .NET 11 its typical epoch cost 16.1 µs per event against sleeping's 15.6, but its mean was 18.1 against 16.4. A
/// rule that judged each exploration by one epoch saw a cheap poll most times, and polled in 38% of the epochs
/// (docs/benchmarks/adaptive-default.md).</item>
/// <item>Both measures from the same seconds. Both ways cost less per request as the load rises (a sleeping loop 19 µs
/// at 25% of the saturated rate, 13.5 at 60%), so an estimate from another load is no measure: at 60% polling cost
/// 16.8 µs per event and sleeping 11.7, and against sleeping's estimate from 25% polling would look cheaper. So the
/// old estimate of the other way is never used, and when the load (bytes per epoch) moves by half or more from where
/// the last run judged it, the next run comes at once. With this, 60% on .NET 11 went from 1.08x to 1.01x
/// the CPU per request of a loop that never polls.</item>
/// </list>
/// <para>The loop starts sleeping, and switches to polling only when polling costs <see cref="SwitchMarginPercent"/>
/// less than the allowance lets it cost (<see cref="Hosting.TransportTuning.IdlePollLatencyAllowancePercent"/>; a poll
/// also answers sooner); it goes back once polling costs more than that. The margin keeps a run that missed the tail
/// from switching. It is close to what polling saves where it pays (9% per byte at 2 connections closed loop), so there
/// some runs keep the loop sleeping.</para>
/// <para>Runs thin out while they keep confirming the choice: one after <see cref="FirstExploreEvery"/> epochs at
/// first, twice as far apart after each that confirms it, up to <see cref="LastExploreEvery"/> (about 6 s of activity
/// at 25 ms epochs, so about 3% of epochs explore); back to <see cref="FirstExploreEvery"/> whenever the choice
/// changes. A run that trails by far after <see cref="CutAfterEpochs"/> epochs ends there (<see cref="Trails"/>).</para>
/// <para>A saturated loop does not poll, and does not explore polling: it sleeps seldom and briefly, so a poll has
/// little wake-up to save, and it would take from each pass the events that gather while the loop sleeps. There the
/// two ways' costs differ by less than one epoch's noise (6.6 against 6.4-6.9 µs per event at 16 connections), so a
/// comparison would follow the noise: with it, polling served 0.88x the requests at 16 connections on .NET 10
/// (docs/benchmarks/adaptive-default.md). Its sleeping epochs go on measuring how busy it is, and the choice resumes
/// when that falls below <see cref="SaturatedPercent"/>. A quiet epoch, too, neither polls nor explores.</para>
/// </remarks>
internal sealed class IdlePollChoice(int allowancePercent)
{
    /// <summary>How many measured epochs an exploration of the other way runs.</summary>
    public const int RunEpochs = 8;

    /// <summary>Epochs between explorations while the choice is new.</summary>
    public const int FirstExploreEvery = 16;

    /// <summary>Epochs between explorations once the choice has been confirmed many times in a row.</summary>
    public const int LastExploreEvery = 256;

    /// <summary>Measured epochs after which a run that trails the incumbent by far ends early.</summary>
    public const int CutAfterEpochs = 2;

    /// <summary>How far (in percent) a run must trail to end early: it would lose even had it cost this much less.</summary>
    public const int CutTrailPercent = 20;

    /// <summary>How much less than the allowance lets it (in percent) polling must cost before a sleeping loop switches to it.</summary>
    public const int SwitchMarginPercent = 5;

    /// <summary>A loop busy this share of its time or more (in percent) while it sleeps is saturated, and does not poll.</summary>
    public const int SaturatedPercent = 90;

    /// <summary>The weight of an incumbent's epoch one epoch older than the last.</summary>
    private const double Decay = 7.0 / 8;

    // The incumbent's recent cost, the run under way, and the incumbent's cost as it stood when that run started.
    private Cost _incumbent;
    private Cost _run;
    private Cost _beforeRun;
    private int _runLeft;
    private int _sinceExplore;

    // Bytes per epoch lately (the incumbent's), and where the last run judged; 0: not yet known.
    private double _load;
    private double _judgedLoad;

    // The busy share of the last measured epoch that slept.
    private int _busy;

    /// <summary>True when the next epoch polls.</summary>
    public bool Polls { get; private set; }

    /// <summary>True while the way the choice does not favour is explored.</summary>
    public bool Exploring => _runLeft > 0;

    /// <summary>True when, between explorations, the loop polls.</summary>
    public bool PollPays { get; private set; }

    /// <summary>Polling's CPU per byte received (nanoseconds) as last measured (0 until then).</summary>
    public double PollCost { get; private set; }

    /// <summary>Sleeping's CPU per byte received (nanoseconds) as last measured (0 until then).</summary>
    public double SleepCost { get; private set; }

    /// <summary>Epochs from one exploration's end to the next one's start (<see cref="FirstExploreEvery"/>..<see cref="LastExploreEvery"/>).</summary>
    public int ExploreEvery { get; private set; } = FirstExploreEvery;

    /// <summary>
    /// The epoch that ran the way <see cref="Polls"/> said has ended: it used <paramref name="cpuNanoseconds"/> of CPU
    /// while its connections received <paramref name="bytes"/>, or 0 and 0 when it had too few events to tell.
    /// <paramref name="busyPercent"/> is the share of its time it was not waiting (read for an epoch that slept);
    /// <paramref name="quiet"/>: so few events that no poll is wanted.
    /// </summary>
    public void EndEpoch(long cpuNanoseconds, long bytes, int busyPercent, bool quiet)
    {
        bool measured = cpuNanoseconds > 0 && bytes > 0;
        if (measured && !Polls)
        {
            _busy = busyPercent;
        }

        bool saturated = _busy >= SaturatedPercent;
        if (Exploring)
        {
            if (quiet || saturated)
            {
                _runLeft = 0; // cut short: a run the load stops or saturates measures no way at this load, and is dropped
            }
            else if (measured)
            {
                _run = _run.Add(cpuNanoseconds, bytes, 1);
                if (--_runLeft == 0 || (RunEpochs - _runLeft >= CutAfterEpochs && Trails()))
                {
                    _runLeft = 0;
                    Judge();
                }
            }
        }
        else
        {
            // Only an epoch that ran the incumbent's way measures it: a saturated or quiet one sleeps whatever it is.
            if (measured && Polls == PollPays)
            {
                _incumbent = _incumbent.Add(cpuNanoseconds, bytes, Decay);
                _load = _load == 0 ? bytes : (Decay * _load) + ((1 - Decay) * bytes);
                _judgedLoad = _judgedLoad == 0 ? _load : _judgedLoad;
                if (Polls)
                {
                    PollCost = _incumbent.PerByte;
                }
                else
                {
                    SleepCost = _incumbent.PerByte;
                }
            }

            bool moved = _judgedLoad > 0 && (_load * 2 > _judgedLoad * 3 || _load * 3 < _judgedLoad * 2);
            if (!quiet && !saturated && _incumbent.Bytes > 0 && (moved || ++_sinceExplore >= ExploreEvery))
            {
                _runLeft = RunEpochs;
                _run = default;
                _beforeRun = _incumbent;
                _sinceExplore = 0;
            }
        }

        Polls = !quiet && !saturated && (PollPays != Exploring);
    }

    /// <summary>
    /// True when the run under way would lose to the incumbent even had it cost <see cref="CutTrailPercent"/> less. Such a
    /// run ends early: where polling pays it never trails so far, and where it does not, a run's epochs cost the most (at
    /// 25% load on .NET 11 a polling epoch cost 2.7 times a sleeping one per byte), so eight of them were most of what
    /// exploring cost there.
    /// </summary>
    private bool Trails()
    {
        double run = _run.PerByte * (100 - CutTrailPercent) / 100, before = _beforeRun.PerByte;
        return PollPays ? PollWins(before, run) : !PollWins(run, before);
    }

    /// <summary>True when polling at <paramref name="poll"/> per byte beats sleeping at <paramref name="sleep"/> for a loop that polls now or not.</summary>
    private bool PollWins(double poll, double sleep)
    {
        int margin = PollPays ? 0 : SwitchMarginPercent;
        return poll * (100 + margin) <= sleep * (100 + allowancePercent);
    }

    /// <summary>A run has ended: the way that costs less, by the run against the incumbent just before it, is chosen.</summary>
    private void Judge()
    {
        // The run explored polling if the incumbent sleeps, and sleeping if it polls.
        double run = _run.PerByte, before = _beforeRun.PerByte;
        (PollCost, SleepCost) = PollPays ? (before, run) : (run, before);
        bool pollPays = PollWins(PollCost, SleepCost);

        ExploreEvery = pollPays != PollPays ? FirstExploreEvery : Math.Min(LastExploreEvery, ExploreEvery * 2);
        if (pollPays != PollPays)
        {
            // The explored way becomes the incumbent, with the run as its recent cost; the load it runs at is judged anew.
            PollPays = pollPays;
            _incumbent = _run;
            _judgedLoad = 0;
            _load = 0;
        }
        else
        {
            _judgedLoad = _load;
        }
    }

    /// <summary>CPU and bytes received summed over epochs, older ones weighing less.</summary>
    private readonly record struct Cost(double Cpu, double Bytes)
    {
        public double PerByte => Bytes > 0 ? Cpu / Bytes : 0;

        public Cost Add(long cpu, long bytes, double decay) => new((Cpu * decay) + cpu, (Bytes * decay) + bytes);
    }
}
