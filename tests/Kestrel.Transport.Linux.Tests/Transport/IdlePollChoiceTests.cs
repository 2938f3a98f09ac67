using Kestrel.Transport.Linux.Loop;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// The idle poll's rule, fed made-up costs one epoch at a time: it runs the cheaper way, tries the other in runs ever
/// more rarely while that keeps losing, follows the costs when they change, judges a way by its total cost, tail
/// included, and never by a measure taken at another load.
/// </summary>
public sealed class IdlePollChoiceTests
{
    private const double SleepCost = 20_000;
    private const int Bytes = 100;
    private const int Busy = 25;

    [Fact]
    public void Where_polling_costs_twice_as_much_it_is_tried_ever_more_rarely()
    {
        var choice = new IdlePollChoice(allowancePercent: 10);
        var polled = Run(choice, 4_000, () => SleepCost * 2);

        // Once the explorations are as far apart as they get, each polls once per LastExploreEvery epochs, and as it
        // trails by far, it ends after CutAfterEpochs epochs rather than RunEpochs.
        const int run = IdlePollChoice.CutAfterEpochs;
        const int cycle = IdlePollChoice.LastExploreEvery + run;
        int first = polled.Take(2_000).Count(p => p);
        int second = polled.Skip(2_000).Count(p => p);
        Assert.Equal(IdlePollChoice.LastExploreEvery, choice.ExploreEvery);
        Assert.InRange(second, ((2_000 / cycle) - 1) * run, ((2_000 / cycle) + 1) * run);
        Assert.True(first < 2_000 / 32, $"{first} of the first 2,000 epochs polled");
    }

    [Fact]
    public void A_run_that_trails_by_less_than_the_cut_runs_all_its_epochs()
    {
        // Polling costs 15% more: it loses each run, but not by enough to end one early, where the tail could yet turn it.
        var choice = new IdlePollChoice(allowancePercent: 0);
        var polled = Run(choice, 4_000, () => SleepCost * 1.15);

        const int cycle = IdlePollChoice.LastExploreEvery + IdlePollChoice.RunEpochs;
        Assert.False(choice.PollPays);
        Assert.InRange(polled.Skip(2_000).Count(p => p), ((2_000 / cycle) - 1) * IdlePollChoice.RunEpochs, ((2_000 / cycle) + 1) * IdlePollChoice.RunEpochs);
    }

    [Fact]
    public void Where_polling_costs_half_as_much_most_epochs_poll_and_sleeping_is_tried_ever_more_rarely()
    {
        var choice = new IdlePollChoice(allowancePercent: 0);
        var polled = Run(choice, 2_000, () => SleepCost / 2);

        const int cycle = IdlePollChoice.LastExploreEvery + IdlePollChoice.RunEpochs;
        Assert.Equal(IdlePollChoice.LastExploreEvery, choice.ExploreEvery);
        Assert.True(choice.PollPays);
        Assert.InRange(polled.Skip(1_000).Count(p => !p), 0, ((1_000 / cycle) + 1) * IdlePollChoice.RunEpochs);
    }

    [Fact]
    public void When_polling_becomes_cheap_after_losing_for_long_the_next_exploration_changes_the_choice()
    {
        var choice = Settled(pollCost: SleepCost * 2, pollPays: false);

        // From now on a poll costs half a sleep. The next exploration, at most LastExploreEvery epochs away, measures
        // it, and from then on the loop polls but for its own explorations of sleeping.
        var polled = Run(choice, IdlePollChoice.LastExploreEvery * 3, () => SleepCost / 2);
        int firstPoll = polled.IndexOf(true);
        Assert.InRange(firstPoll, 0, IdlePollChoice.LastExploreEvery);
        var after = polled.Skip(firstPoll + IdlePollChoice.RunEpochs).Take(IdlePollChoice.LastExploreEvery).ToList();
        Assert.True(choice.PollPays);
        Assert.True(after.Count(p => p) >= IdlePollChoice.LastExploreEvery - (3 * IdlePollChoice.RunEpochs), $"polled in {after.Count(p => p)} of the {after.Count} epochs after the first exploration");
    }

    [Fact]
    public void A_poll_whose_typical_epoch_is_cheaper_but_whose_tail_makes_it_costlier_is_seldom_chosen()
    {
        // As traced at 5% load on .NET 11: most polling epochs cost a little less than sleeping ones, but one in six
        // costs nearly twice as much, so polling costs about 10% more in all. A rule that judged each exploration by one
        // epoch polled in 38% of the epochs there.
        var random = new Random(37);
        double Poll() => random.Next(6) == 0 ? 30_000 : 15_500 + random.Next(-1_000, 1_000);
        var choice = new IdlePollChoice(allowancePercent: 0);
        var polled = Run(choice, 6_000, Poll, sleepCost: () => 16_400 + random.Next(-2_000, 2_000));

        int share = polled.Skip(1_000).Count(p => p) * 100 / 5_000;
        Assert.True(share <= 8, $"polled in {share}% of the epochs");
    }

    [Fact]
    public void A_poll_that_costs_a_little_less_does_not_take_over_from_sleeping()
    {
        // 2% cheaper is within the switch margin: not worth the loop's while, and within what a run cannot tell apart.
        var choice = new IdlePollChoice(allowancePercent: 0);
        var polled = Run(choice, 2_000, () => SleepCost * 0.98);
        Assert.False(choice.PollPays);
        Assert.True(polled.Skip(1_000).Count(p => p) <= ((1_000 / IdlePollChoice.LastExploreEvery) + 1) * IdlePollChoice.RunEpochs);
    }

    [Fact]
    public void A_saturated_loop_never_polls_even_where_a_poll_measured_cheaper_and_polls_again_once_it_is_not()
    {
        // While the loop is busy 95% of the time, a poll that costs half as much per event is never tried...
        var choice = new IdlePollChoice(allowancePercent: 10);
        var saturated = Run(choice, 1_000, () => SleepCost / 2, busy: 95);
        Assert.DoesNotContain(true, saturated);

        // ...and once it is a quarter busy, polling wins again, but for explorations of sleeping.
        var quarter = Run(choice, 1_000, () => SleepCost / 2);
        Assert.True(quarter.Skip(500).Count(p => p) >= 500 - (3 * IdlePollChoice.RunEpochs), $"polled in {quarter.Skip(500).Count(p => p)} of 500 epochs");
    }

    [Fact]
    public void The_epochs_a_saturated_loop_sleeps_through_do_not_count_as_polling()
    {
        var choice = Settled(pollCost: SleepCost / 2, pollPays: true);

        // The load doubles and saturates the loop. Its run of sleeping finds it busy 95% of the time, so it sleeps from
        // then on, at three times polling's old cost per byte; a polling epoch never sees how busy the loop is.
        var saturated = Run(choice, 200, () => SleepCost / 2, busy: 95, sleepCost: () => SleepCost * 3, bytes: Bytes * 2);
        Assert.DoesNotContain(true, saturated.TakeLast(100));

        // Unsaturated again, polling costs half of sleeping as before. Had the saturated epochs been counted as the
        // incumbent's, polling would look six times dearer than it is, and the next run of sleeping would win.
        var after = Run(choice, 40, () => SleepCost / 2, bytes: Bytes * 2);
        Assert.True(choice.PollPays);
        Assert.True(after.Count(p => p) >= 40 - (2 * IdlePollChoice.RunEpochs) - 1, $"polled in {after.Count(p => p)} of 40 epochs");
    }

    [Fact]
    public void A_poll_that_costs_more_is_chosen_within_the_latency_allowance_only()
    {
        // Polling costs 3% more per event: within a 10% allowance (less the switch margin), not within none.
        var relaxed = new IdlePollChoice(allowancePercent: 10);
        Assert.True(Run(relaxed, 1_000, () => SleepCost * 1.03).Skip(500).Count(p => p) > 450);

        var strict = new IdlePollChoice(allowancePercent: 0);
        Assert.True(Run(strict, 1_000, () => SleepCost * 1.03).Skip(500).Count(p => !p) > 450);
    }

    [Fact]
    public void When_the_load_moves_the_next_run_comes_at_once_and_is_judged_against_costs_at_the_new_load()
    {
        // At one load polling costs 0.8 of sleeping, and wins for long enough that runs are far apart.
        var choice = Settled(pollCost: SleepCost * 0.8, pollPays: true);

        // At 2.4 times the load both ways cost less, and polling (0.84 of the old sleeping cost) now costs more than
        // sleeping (0.6): still less than the sleeping cost measured at the old load. The next run comes within a few
        // epochs, not LastExploreEvery, and compares the two at the new load.
        var polled = Run(choice, IdlePollChoice.LastExploreEvery, () => SleepCost * 0.84, sleepCost: () => SleepCost * 0.6, bytes: Bytes * 12 / 5);
        Assert.False(choice.PollPays);
        int firstSleep = polled.IndexOf(false);
        Assert.InRange(firstSleep, 0, 4 * IdlePollChoice.RunEpochs);

        // From then on it polls only in runs that explore polling, 16, 32, 64 and 128 epochs apart: four at most.
        int polls = polled.Skip(firstSleep + IdlePollChoice.RunEpochs).Count(p => p);
        Assert.True(polls <= 4 * IdlePollChoice.RunEpochs, $"polled in {polls} epochs after sleeping had won");
    }

    [Fact]
    public void A_quiet_epoch_never_polls_cuts_an_exploration_short_and_an_unmeasured_one_leaves_the_estimates_alone()
    {
        var choice = new IdlePollChoice(allowancePercent: 0);
        Run(choice, 100, () => SleepCost / 2);
        Assert.True(choice.Polls);
        double pollCost = choice.PollCost;

        choice.EndEpoch(0, 0, Busy, quiet: true);
        Assert.False(choice.Polls);
        Assert.Equal(pollCost, choice.PollCost);

        // An exploration of polling, from a sleeping loop, that a quiet epoch interrupts leaves polling's estimate
        // where it was, though the run measured polling at twice the cost.
        var sleeper = Settled(pollCost: SleepCost * 2, pollPays: false);
        while (!sleeper.Exploring)
        {
            sleeper.EndEpoch((long)(SleepCost * Bytes), Bytes, Busy, quiet: false);
        }

        double before = sleeper.PollCost;
        sleeper.EndEpoch((long)(SleepCost * 4 * Bytes), Bytes, Busy, quiet: false);
        sleeper.EndEpoch(0, 0, Busy, quiet: true);
        Assert.False(sleeper.Exploring);
        Assert.Equal(before, sleeper.PollCost);
    }

    /// <summary>
    /// A choice without allowance that has run 2,000 epochs at <paramref name="pollCost"/> per byte polling and
    /// <see cref="SleepCost"/> sleeping: settled on <paramref name="pollPays"/>, with its runs as far apart as they get.
    /// </summary>
    private static IdlePollChoice Settled(double pollCost, bool pollPays)
    {
        var choice = new IdlePollChoice(allowancePercent: 0);
        Run(choice, 2_000, () => pollCost);
        Assert.Equal(pollPays, choice.PollPays);
        Assert.Equal(IdlePollChoice.LastExploreEvery, choice.ExploreEvery);
        return choice;
    }

    /// <summary>
    /// Runs <paramref name="epochs"/> epochs that receive <paramref name="bytes"/> each: an epoch that polls costs
    /// <paramref name="pollCost"/>() per byte; if it sleeps, <paramref name="sleepCost"/>() or <see cref="SleepCost"/>.
    /// Returns whether each polled.
    /// </summary>
    private static List<bool> Run(IdlePollChoice choice, int epochs, Func<double> pollCost, int busy = Busy, Func<double>? sleepCost = null, int bytes = Bytes)
    {
        var polled = new List<bool>(epochs);
        for (int i = 0; i < epochs; i++)
        {
            bool polls = choice.Polls;
            polled.Add(polls);
            double cost = polls ? pollCost() : sleepCost?.Invoke() ?? SleepCost;
            choice.EndEpoch((long)(cost * bytes), bytes, busy, quiet: false);
        }

        return polled;
    }
}
