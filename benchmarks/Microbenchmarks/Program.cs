using BenchmarkDotNet.Reports;
using BenchmarkDotNet.Running;
using Kestrel.Transport.Linux.Microbenchmarks;
using LibuvComparator;

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

// The HTTP suite's Libuv cases need the system's libuv.so.1 (Debian's libuv1), which this program does not ship.
// Without it, one line here and no Libuv rows serve someone running the suite better than a failed process per
// case. CI sets KTL_REQUIRE_LIBUV=1 and installs libuv1, so there a missing library fails the run instead of
// quietly shrinking what CI proves.
const string RequireLibuvVariable = "KTL_REQUIRE_LIBUV";
try
{
    Console.WriteLine($"microbenchmarks: libuv {LibuvComparatorOptions.LibuvVersion} (libuv.so.1) for the HTTP suite's Libuv cases");
}
catch (DllNotFoundException e)
{
    if (Environment.GetEnvironmentVariable(RequireLibuvVariable) == "1")
    {
        Console.Error.WriteLine($"microbenchmarks: {RequireLibuvVariable}=1, but libuv.so.1 did not load: {e.Message}");
        return 1;
    }

    SuiteScope.LibuvAvailable = false;
    Console.WriteLine($"microbenchmarks: the HTTP suite runs without its Libuv cases, as libuv.so.1 did not load: {e.Message}."
        + $" ({RequireLibuvVariable}=1 makes this an error.)");
}

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
