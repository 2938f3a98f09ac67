namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>
/// Tests that count the process's descriptors and threads. xunit runs a collection that disables
/// parallelization on its own, after the parallel ones, so nothing else opens or closes descriptors meanwhile.
/// </summary>
[CollectionDefinition(Name, DisableParallelization = true)]
public sealed class QuietProcess
{
    public const string Name = "Quiet process";
}
