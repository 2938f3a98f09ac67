using BenchmarkDotNet.Attributes;
using BenchmarkDotNet.Filters;
using BenchmarkDotNet.Running;

namespace Kestrel.Transport.Linux.Microbenchmarks.Http;

/// <summary>
/// Leaves out the Transport x Scheduling cases the transport does not have (libuv with Inline), so the suite
/// keeps Transport and Scheduling as two independent parameters, each its own column in the tables.
/// </summary>
/// <remarks>
/// BenchmarkDotNet builds the cross product of all parameters and has no way to skip one combination. A
/// filter on the class, rather than in <see cref="MicrobenchmarkConfig"/>, goes wherever the class goes:
/// BenchmarkDotNet merges it with the run's config, and it holds under any other config or --filter too.
/// </remarks>
[AttributeUsage(AttributeTargets.Class)]
public sealed class SupportedSchedulingOnlyAttribute : FilterConfigBaseAttribute
{
    private const string TransportParameter = nameof(HttpPipelineBenchmarks.Transport);
    private const string SchedulingParameter = nameof(HttpPipelineBenchmarks.Scheduling);

    public SupportedSchedulingOnlyAttribute()
        : base(new SimpleFilter(IsSupported))
    {
    }

    private static bool IsSupported(BenchmarkCase benchmarkCase)
        => benchmarkCase.Parameters[TransportParameter] is not TransportKind transport
            || benchmarkCase.Parameters[SchedulingParameter] is not SchedulingMode scheduling
            || HelloWorldServer.Supports(transport, scheduling);
}
