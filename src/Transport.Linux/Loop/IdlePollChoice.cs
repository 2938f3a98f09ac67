namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// Which way <see cref="IdlePoll"/> waits in its next epoch, poll or sleep, from what each way has cost per event
/// lately. Fed one epoch at a time, with no clock of its own, so its rule can be tested on made-up costs. Loop thread only.
/// </summary>
/// <remarks>
/// <para>Each way's cost is an average over its recent epochs. Most epochs run the way that costs less (polling may
/// cost up to the allowance more, since a poll also answers sooner), and now and then
/// one runs the other, so that its estimate stays current. Such an exploring epoch costs what the losing way costs, and
/// where polling loses it loses by a lot: at a quarter of the loop's capacity a polling epoch cost twice a sleeping one
/// (docs/benchmarks/adaptive-default.md). So the explorations thin out while they keep confirming the choice: one epoch
/// in <see cref="FirstExploreEvery"/> at first, twice as far apart after each that confirms it, down to one in
/// <see cref="LastExploreEvery"/> (about 3 s of activity at 25 ms epochs); back to one in
/// <see cref="FirstExploreEvery"/> whenever the choice changes. An exploring epoch's cost replaces its way's estimate,
/// so that a change in the costs shows at the next exploration.</para>
/// <para>A saturated loop does not poll, and does not explore polling: it sleeps seldom and briefly, so a poll has
/// little wake-up to save, and it would take from each pass the events that gather while the loop sleeps. There the
/// two ways' costs per event differ by less than one epoch's noise (6.6 against 6.4-6.9 µs at 16 connections), so a
/// comparison would follow the noise: with it, polling served 0.88x the requests at 16 connections on .NET 10
/// (docs/benchmarks/adaptive-default.md). Its sleeping epochs go on measuring how busy it is, and the choice resumes
/// when that falls below <see cref="SaturatedPercent"/>.</para>
/// </remarks>
internal sealed class IdlePollChoice(int allowancePercent)
{
    /// <summary>How often the losing way is tried while the choice is new.</summary>
    public const int FirstExploreEvery = 8;

    /// <summary>How often the losing way is tried once it has lost many times in a row.</summary>
    public const int LastExploreEvery = 128;

    /// <summary>A loop busy this share of its time or more (in percent) while it sleeps is saturated, and does not poll.</summary>
    public const int SaturatedPercent = 90;

    private int _epochs;
    private int _sinceExplore;
    private bool _exploring;
    private bool _pollPays;

    // The busy share of the last measured epoch that slept.
    private int _busy;

    /// <summary>True when the next epoch polls.</summary>
    public bool Polls { get; private set; }

    /// <summary>Recent CPU per event of an epoch that polled (nanoseconds; 0 until measured).</summary>
    public double PollCost { get; private set; }

    /// <summary>Recent CPU per event of an epoch that slept (nanoseconds; 0 until measured).</summary>
    public double SleepCost { get; private set; }

    /// <summary>One epoch in this many runs the losing way (<see cref="FirstExploreEvery"/>..<see cref="LastExploreEvery"/>).</summary>
    public int ExploreEvery { get; private set; } = FirstExploreEvery;

    /// <summary>
    /// The epoch that ran the way <see cref="Polls"/> said has ended. <paramref name="costPerEvent"/> is its CPU per event
    /// (nanoseconds), or null when it had too few events to tell; <paramref name="busyPercent"/> is the share of its time
    /// it was not waiting (read for an epoch that slept); <paramref name="quiet"/>: so few events that no poll is wanted.
    /// </summary>
    public void EndEpoch(double? costPerEvent, int busyPercent, bool quiet)
    {
        if (costPerEvent is double cost)
        {
            // An exploring epoch is its way's only recent measure, so it replaces that way's estimate (as old as the
            // explorations are far apart) rather than moving it a quarter of the way: when the costs have changed, one
            // exploration is enough to change the choice.
            if (Polls)
            {
                PollCost = PollCost == 0 || _exploring ? cost : (0.75 * PollCost) + (0.25 * cost);
            }
            else
            {
                SleepCost = SleepCost == 0 || _exploring ? cost : (0.75 * SleepCost) + (0.25 * cost);
                _busy = busyPercent;
            }
        }

        _epochs++;
        bool unknown = PollCost == 0 || SleepCost == 0;
        bool saturated = _busy >= SaturatedPercent;
        bool pollPays = !unknown && !saturated && PollCost * 100 <= SleepCost * (100 + allowancePercent);
        if (!unknown)
        {
            if (pollPays != _pollPays)
            {
                ExploreEvery = FirstExploreEvery;
            }
            else if (_exploring && costPerEvent is not null)
            {
                ExploreEvery = Math.Min(LastExploreEvery, ExploreEvery * 2);
            }
        }

        _pollPays = pollPays;
        _exploring = !unknown && !quiet && !saturated && ++_sinceExplore >= ExploreEvery;
        if (_exploring)
        {
            _sinceExplore = 0;
        }

        Polls = !quiet && !saturated && (unknown ? _epochs % 2 == 0 : pollPays != _exploring);
    }
}
