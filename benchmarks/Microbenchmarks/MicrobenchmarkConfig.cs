using BenchmarkDotNet.Configs;
using BenchmarkDotNet.Diagnosers;
using BenchmarkDotNet.Exporters;
using BenchmarkDotNet.Exporters.Csv;
using BenchmarkDotNet.Exporters.Json;
using BenchmarkDotNet.Jobs;
using BenchmarkDotNet.Toolchains.InProcess.Emit;
using Perfolizer.Horology;

namespace Kestrel.Transport.Linux.Microbenchmarks;

/// <summary>The one config both suites run under: exporters, diagnosers, the artifacts folder and the job.</summary>
internal static class MicrobenchmarkConfig
{
    public const string QuickSwitch = "--quick";

    /// <summary>BenchmarkDotNet's own spelling of the in-process switch, applied to this config's job.</summary>
    public static readonly string[] InProcessSwitches = ["--inProcess", "-i"];

    /// <summary>Relative to the working directory, so a run from the repository root lands in its ignored artifacts/.</summary>
    public static readonly string ArtifactsPath = Path.Combine("artifacts", "microbenchmarks");

    public static IConfig Create(bool quick, bool inProcess)
    {
        // Built from empty rather than from DefaultConfig so that only the three exporters asked for run.
        return ManualConfig.CreateEmpty()
            .AddColumnProvider(DefaultConfig.Instance.GetColumnProviders().ToArray())
            .AddLogger(DefaultConfig.Instance.GetLoggers().ToArray())
            .AddAnalyser(DefaultConfig.Instance.GetAnalysers().ToArray())
            .AddValidator(DefaultConfig.Instance.GetValidators().ToArray())
            .AddExporter(MarkdownExporter.GitHub, CsvExporter.Default, JsonExporter.Full)
            .AddDiagnoser(MemoryDiagnoser.Default, ThreadingDiagnoser.Default)
            .AddJob(WithToolchain(quick ? QuickJob : FullJob, inProcess))
            .WithArtifactsPath(Path.GetFullPath(ArtifactsPath));
    }

    /// <summary>
    /// Out of process by default, with BenchmarkDotNet's default toolchain (a generated net10.0 child project):
    /// every benchmark case gets a fresh process, and one case's thread pool, JIT state and socket engine never
    /// leak into the next. In process (InProcessEmitToolchain) is there for quick looks and for profilers
    /// attached to one process.
    /// </summary>
    private static Job WithToolchain(Job job, bool inProcess)
        => inProcess ? job.WithToolchain(InProcessEmitToolchain.Instance) : job;

    /// <summary>
    /// BenchmarkDotNet's defaults: 500 ms iterations, and an iteration count (15..100) picked from the noise
    /// it sees.
    /// </summary>
    private static Job FullJob => Job.Default.WithId("Full");

    /// <summary>ShortRun's shape with 100 ms iterations: enough to prove every case runs and answers correctly.</summary>
    private static Job QuickJob => Job.Default
        .WithId("Quick")
        .WithLaunchCount(1)
        .WithWarmupCount(3)
        .WithIterationCount(3)
        .WithIterationTime(TimeInterval.FromMilliseconds(100));
}
