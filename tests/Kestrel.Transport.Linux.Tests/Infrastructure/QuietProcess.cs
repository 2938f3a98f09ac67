namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>
/// Tests that count the process's descriptors and threads, and tests whose case needs the loop's timing undisturbed
/// (eight hand-offs within one second, packets still queued in a throttled qdisc at a reset): on 2 CPUs the hosts
/// of the parallel tests delay the loop and the monitor enough to leave such a case unmade. Tests that hold many pool
/// threads asleep for seconds belong here too, for the tests they would starve. xunit runs a collection
/// that disables parallelization on its own, after the parallel ones, so nothing else runs meanwhile.
/// </summary>
[CollectionDefinition(Name, DisableParallelization = true)]
public sealed class QuietProcess
{
    public const string Name = "Quiet process";
}
