using BenchmarkDotNet.Reports;
using BenchmarkDotNet.Running;
using Kestrel.Transport.Linux.Microbenchmarks;

// --quick is ours (a CI smoke run: few iterations, a small parameter subset). --inProcess/-i is taken here
// too: given to BenchmarkSwitcher it would add a second, default job beside ours instead of moving ours in
// process. Everything else goes to BenchmarkDotNet's command line, so --filter, --list flat, --iterationCount
// and the rest work as documented.
bool quick = args.Contains(MicrobenchmarkConfig.QuickSwitch, StringComparer.Ordinal);
bool inProcess = args.Any(MicrobenchmarkConfig.InProcessSwitches.Contains);
string[] switcherArgs = args
    .Where(a => a != MicrobenchmarkConfig.QuickSwitch && !MicrobenchmarkConfig.InProcessSwitches.Contains(a))
    .ToArray();

// Without a filter the switcher asks on the console which benchmark to run; CI has no console to answer.
if (!switcherArgs.Any(IsSelectionArgument))
{
    switcherArgs = [.. switcherArgs, "--filter", "*"];
}

SuiteScope.Quick = quick;
IEnumerable<Summary> summaries = BenchmarkSwitcher
    .FromAssembly(typeof(SuiteScope).Assembly)
    .Run(switcherArgs, MicrobenchmarkConfig.Create(quick, inProcess));

// A benchmark that threw (a server answering wrongly, a read that found no bytes) leaves an NA row and a
// report that is not a success; say so in the exit code so CI notices.
var failed = summaries
    .SelectMany(s => s.Reports.Where(r => !r.Success).Select(r => r.BenchmarkCase.DisplayInfo)
        .Concat(s.HasCriticalValidationErrors ? [$"{s.Title}: validation failed"] : []))
    .ToList();
foreach (string name in failed)
{
    Console.Error.WriteLine($"microbenchmarks: failed: {name}");
}

return failed.Count == 0 ? 0 : 1;

static bool IsSelectionArgument(string arg) => arg is "--filter" or "-f" or "--list" or "--help" or "-h" or "--version" or "--info"
    || arg.StartsWith("--filter=", StringComparison.Ordinal);
