using BenchmarkDotNet.Analysers;
using BenchmarkDotNet.Diagnosers;
using BenchmarkDotNet.Engines;
using BenchmarkDotNet.Exporters;
using BenchmarkDotNet.Loggers;
using BenchmarkDotNet.Reports;
using BenchmarkDotNet.Running;
using BenchmarkDotNet.Validators;

namespace Kestrel.Transport.Linux.Microbenchmarks;

/// <summary>
/// BenchmarkDotNet's <see cref="ThreadingDiagnoser"/> without its runtime check. 0.14.0's
/// <c>RuntimeMoniker</c> ends at net9.0, so net10.0 resolves to <c>NotRecognized</c>, which sorts below
/// NetCoreApp30, and the diagnoser rejects the run as "supports only .NET Core 3.0+". The counters it reads
/// (ThreadPool.CompletedWorkItemCount, Monitor.LockContentionCount) exist on .NET 10 and the numbers come
/// through unchanged: everything but <see cref="Validate"/> is delegated.
/// </summary>
/// <remarks>
/// Configured beside <see cref="MemoryDiagnoser"/>; with both, a Task.Run probe reported one completed work
/// item per operation on .NET 10, out of process and in process.
/// </remarks>
internal sealed class ThreadingDiagnoserForNet10 : IDiagnoser
{
    public static readonly ThreadingDiagnoserForNet10 Instance = new();

    private static readonly ThreadingDiagnoser s_inner = ThreadingDiagnoser.Default;

    private ThreadingDiagnoserForNet10()
    {
    }

    public IEnumerable<string> Ids => s_inner.Ids;

    public IEnumerable<IExporter> Exporters => s_inner.Exporters;

    public IEnumerable<IAnalyser> Analysers => s_inner.Analysers;

    public RunMode GetRunMode(BenchmarkCase benchmarkCase) => s_inner.GetRunMode(benchmarkCase);

    public void Handle(HostSignal signal, DiagnoserActionParameters parameters) => s_inner.Handle(signal, parameters);

    public IEnumerable<Metric> ProcessResults(DiagnoserResults results) => s_inner.ProcessResults(results);

    public void DisplayResults(ILogger logger) => s_inner.DisplayResults(logger);

    public IEnumerable<ValidationError> Validate(ValidationParameters validationParameters) => [];
}
