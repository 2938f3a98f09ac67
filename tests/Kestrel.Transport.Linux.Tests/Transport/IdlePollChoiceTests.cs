using Kestrel.Transport.Linux.Loop;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// The idle poll's rule, fed made-up costs one epoch at a time: it runs the cheaper way, tries the other ever more
/// rarely while that keeps losing, and follows the costs when they change.
/// </summary>
public sealed class IdlePollChoiceTests
{
    private const double SleepCost = 20_000;
    private const int Busy = 25;

    [Fact]
    public void Where_polling_costs_twice_as_much_it_is_tried_ever_more_rarely()
    {
        var choice = new IdlePollChoice(allowancePercent: 10);
        var polled = Run(choice, 4_000, SleepCost * 2);

        // After the first two epochs, which measure each way once, polling is only ever an exploration.
        int first = polled.Take(2_000).Count(p => p);
        int second = polled.Skip(2_000).Count(p => p);
        Assert.Equal(IdlePollChoice.LastExploreEvery, choice.ExploreEvery);
        Assert.InRange(second, 2_000 / IdlePollChoice.LastExploreEvery, (2_000 / IdlePollChoice.LastExploreEvery) + 1);
        Assert.True(first < 2_000 / IdlePollChoice.FirstExploreEvery / 2, $"{first} of the first 2,000 epochs polled");
    }

    [Fact]
    public void Where_polling_costs_half_as_much_most_epochs_poll_and_sleeping_is_tried_ever_more_rarely()
    {
        var choice = new IdlePollChoice(allowancePercent: 0);
        var polled = Run(choice, 2_000, SleepCost / 2);

        Assert.Equal(IdlePollChoice.LastExploreEvery, choice.ExploreEvery);
        Assert.True(polled.Skip(1_000).Count(p => !p) <= (1_000 / IdlePollChoice.LastExploreEvery) + 1);
    }

    [Fact]
    public void When_polling_becomes_cheap_after_losing_for_long_the_next_exploration_changes_the_choice()
    {
        var choice = new IdlePollChoice(allowancePercent: 0);
        Run(choice, 2_000, SleepCost * 2);
        Assert.False(choice.Polls);
        Assert.Equal(IdlePollChoice.LastExploreEvery, choice.ExploreEvery);

        // From now on a poll costs half a sleep. The next exploration, at most LastExploreEvery epochs away, measures
        // it, and from then on the loop polls but for its own explorations of sleeping.
        var polled = Run(choice, IdlePollChoice.LastExploreEvery * 3, SleepCost / 2);
        int firstPoll = polled.IndexOf(true);
        Assert.InRange(firstPoll, 0, IdlePollChoice.LastExploreEvery - 1);
        var after = polled.Skip(firstPoll).Take(IdlePollChoice.LastExploreEvery).ToList();
        Assert.True(after.Count(p => p) >= IdlePollChoice.LastExploreEvery - 4, $"polled in {after.Count(p => p)} of the {after.Count} epochs after the first poll");
    }

    [Fact]
    public void A_saturated_loop_never_polls_even_where_a_poll_measured_cheaper_and_polls_again_once_it_is_not()
    {
        // While the loop is busy 95% of the time, a poll that costs half as much per event is never tried...
        var choice = new IdlePollChoice(allowancePercent: 10);
        var saturated = Run(choice, 1_000, SleepCost / 2, busy: 95);
        Assert.DoesNotContain(true, saturated);

        // ...and once it is a quarter busy, polling wins again, but for explorations of sleeping.
        var quarter = Run(choice, 1_000, SleepCost / 2);
        Assert.True(quarter.Skip(500).Count(p => p) > 490, $"polled in {quarter.Skip(500).Count(p => p)} of 500 epochs");
    }

    [Fact]
    public void A_poll_that_costs_more_is_chosen_within_the_latency_allowance_only()
    {
        // Polling costs 5% more per event: within a 10% allowance, not within none.
        var relaxed = new IdlePollChoice(allowancePercent: 10);
        Assert.True(Run(relaxed, 1_000, SleepCost * 1.05).Skip(500).Count(p => p) > 450);

        var strict = new IdlePollChoice(allowancePercent: 0);
        Assert.True(Run(strict, 1_000, SleepCost * 1.05).Skip(500).Count(p => !p) > 450);
    }

    [Fact]
    public void A_quiet_epoch_never_polls_and_an_unmeasured_one_leaves_the_estimates_alone()
    {
        var choice = new IdlePollChoice(allowancePercent: 0);
        Run(choice, 100, SleepCost / 2);
        Assert.True(choice.Polls);
        double pollCost = choice.PollCost;

        choice.EndEpoch(costPerEvent: null, Busy, quiet: true);
        Assert.False(choice.Polls);
        Assert.Equal(pollCost, choice.PollCost);
    }

    /// <summary>
    /// Runs <paramref name="epochs"/> epochs: each one that polls costs <paramref name="pollCost"/> per event, each one
    /// that sleeps <see cref="SleepCost"/>. Returns whether each polled.
    /// </summary>
    private static List<bool> Run(IdlePollChoice choice, int epochs, double pollCost, int busy = Busy)
    {
        var polled = new List<bool>(epochs);
        for (int i = 0; i < epochs; i++)
        {
            bool polls = choice.Polls;
            polled.Add(polls);
            choice.EndEpoch(polls ? pollCost : SleepCost, busy, quiet: false);
        }

        return polled;
    }
}
