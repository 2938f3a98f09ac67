namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// Which way <see cref="IdlePoll"/> waits in its next epoch, poll or sleep, from what each way has cost per event
/// lately. Fed one epoch at a time, with no clock of its own, so its rule can be tested on made-up costs. Loop thread only.
/// </summary>
/// <remarks>
/// <para>A way's cost is its CPU over its events, both summed over several epochs: the incumbent's over its recent
/// ones (each older epoch weighing <see cref="Decay"/> as much), the other's over its last exploration, a run of
/// <see cref="RunEpochs"/> epochs. Sums, not an average of each epoch's cost, and runs, not single epochs, because
/// polling's extra cost sits in a tail of a few expensive epochs: at 5% load on .NET 11 its typical epoch cost 16.1 µs
/// per event against sleeping's 15.6, but its mean was 18.1 against 16.4. A rule that judged each exploration by one
/// epoch saw a cheap poll most times, and polled in 38% of the epochs (docs/benchmarks/adaptive-default.md).</para>
/// <para>The loop starts sleeping, and switches to polling only when polling costs <see cref="SwitchMarginPercent"/>
/// less than the allowance lets it cost (<see cref="Hosting.TransportTuning.IdlePollLatencyAllowancePercent"/>; a poll
/// also answers sooner); it goes back once polling costs more than that. The margin keeps a run that missed the tail
/// from switching: where polling has paid, it paid by 10% or more. The choice changes only at the end of an
/// exploration, on a fresh measure of both ways; when the incumbent's estimate drifts past the other's older one, that
/// exploration starts at once.</para>
/// <para>Explorations thin out while they keep confirming the choice: one run after <see cref="FirstExploreEvery"/>
/// epochs at first, twice as far apart after each that confirms it, up to <see cref="LastExploreEvery"/> (about 6 s of
/// activity at 25 ms epochs, so about 3% of epochs explore); back to <see cref="FirstExploreEvery"/> whenever the choice
/// changes.</para>
/// <para>A saturated loop does not poll, and does not explore polling: it sleeps seldom and briefly, so a poll has
/// little wake-up to save, and it would take from each pass the events that gather while the loop sleeps. There the
/// two ways' costs per event differ by less than one epoch's noise (6.6 against 6.4-6.9 µs at 16 connections), so a
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

    /// <summary>How much less than the allowance lets it (in percent) polling must cost before a sleeping loop switches to it.</summary>
    public const int SwitchMarginPercent = 5;

    /// <summary>A loop busy this share of its time or more (in percent) while it sleeps is saturated, and does not poll.</summary>
    public const int SaturatedPercent = 90;

    /// <summary>The weight of an incumbent's epoch one epoch older than the last.</summary>
    private const double Decay = 7.0 / 8;

    private Cost _poll;
    private Cost _sleep;
    private Cost _run;
    private int _runLeft;
    private int _sinceExplore;

    // The busy share of the last measured epoch that slept.
    private int _busy;

    /// <summary>True when the next epoch polls.</summary>
    public bool Polls { get; private set; }

    /// <summary>True while the way the choice does not favour is explored.</summary>
    public bool Exploring => _runLeft > 0;

    /// <summary>True when, between explorations, the loop polls.</summary>
    public bool PollPays { get; private set; }

    /// <summary>Recent CPU per event of polling (nanoseconds; 0 until measured).</summary>
    public double PollCost => _poll.PerEvent;

    /// <summary>Recent CPU per event of sleeping (nanoseconds; 0 until measured).</summary>
    public double SleepCost => _sleep.PerEvent;

    /// <summary>Epochs from one exploration's end to the next one's start (<see cref="FirstExploreEvery"/>..<see cref="LastExploreEvery"/>).</summary>
    public int ExploreEvery { get; private set; } = FirstExploreEvery;

    /// <summary>
    /// The epoch that ran the way <see cref="Polls"/> said has ended: it used <paramref name="cpuNanoseconds"/> of CPU
    /// for <paramref name="events"/> events, or 0 and 0 when it had too few events to tell. <paramref name="busyPercent"/>
    /// is the share of its time it was not waiting (read for an epoch that slept); <paramref name="quiet"/>: so few
    /// events that no poll is wanted.
    /// </summary>
    public void EndEpoch(long cpuNanoseconds, long events, int busyPercent, bool quiet)
    {
        bool measured = cpuNanoseconds > 0 && events > 0;
        if (measured)
        {
            if (Exploring)
            {
                _run = _run.Add(cpuNanoseconds, events, 1);
            }
            else if (Polls)
            {
                _poll = _poll.Add(cpuNanoseconds, events, Decay);
            }
            else
            {
                _sleep = _sleep.Add(cpuNanoseconds, events, Decay);
            }

            if (!Polls)
            {
                _busy = busyPercent;
            }
        }

        bool saturated = _busy >= SaturatedPercent;
        if (Exploring && (quiet || saturated))
        {
            _runLeft = 0; // cut short: what it measured is not comparable, and is dropped
        }
        else if (Exploring && measured && --_runLeft == 0)
        {
            if (Polls)
            {
                _poll = _run;
            }
            else
            {
                _sleep = _run;
            }

            bool pollPays = Compare();
            ExploreEvery = pollPays != PollPays ? FirstExploreEvery : Math.Min(LastExploreEvery, ExploreEvery * 2);
            PollPays = pollPays;
        }
        else if (!Exploring)
        {
            // Until both ways are measured, the loop sleeps and explores polling every run's length. Once they are,
            // an incumbent whose estimate has drifted past the other's older one has it measured again at once.
            bool unknown = _poll.Events == 0 || _sleep.Events == 0;
            bool drifted = !unknown && !saturated && Compare() != PollPays;
            if (!quiet && !saturated && (drifted || ++_sinceExplore >= (unknown ? RunEpochs : ExploreEvery)))
            {
                _runLeft = RunEpochs;
                _run = default;
                _sinceExplore = 0;
            }
        }

        Polls = !quiet && !saturated && (PollPays != Exploring);
    }

    /// <summary>Whether polling pays, from the two estimates: entering it needs the margin, staying in it does not.</summary>
    private bool Compare()
    {
        if (_poll.Events == 0 || _sleep.Events == 0 || _busy >= SaturatedPercent)
        {
            return false;
        }

        int margin = PollPays ? 0 : SwitchMarginPercent;
        return _poll.PerEvent * (100 + margin) <= _sleep.PerEvent * (100 + allowancePercent);
    }

    /// <summary>CPU and events summed over epochs, older ones weighing less.</summary>
    private readonly record struct Cost(double Cpu, double Events)
    {
        public double PerEvent => Events > 0 ? Cpu / Events : 0;

        public Cost Add(long cpu, long events, double decay) => new((Cpu * decay) + cpu, (Events * decay) + events);
    }
}
