using System.Reflection;
using System.Runtime.InteropServices;
using System.Runtime.Versioning;
using Microsoft.AspNetCore.Server.Kestrel.Core;
using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Runtime;

/// <summary>
/// Which .NET and ASP.NET Core the suite and the sample it starts run on, said in the log and checked. Both are built for
/// net10.0; test.sh also runs the suite on the .NET 11 runtime (tests/dotnet11), where a test host or a sample that quietly
/// started on .NET 10 would pass every test and prove nothing. KTL_EXPECT_RUNTIME names the major version the run must be
/// on; unset, it is the one built for.
/// </summary>
public sealed class RuntimeUnderTestTests(ITestOutputHelper output)
{
    /// <summary>The major version the run must be on, when it is not the one the suite is built for.</summary>
    public const string ExpectVariable = "KTL_EXPECT_RUNTIME";

    private const string KestrelCore = "Microsoft.AspNetCore.Server.Kestrel.Core.dll";
    private const string CoreLib = "System.Private.CoreLib.dll";

    [Fact]
    public async Task The_suite_and_the_sample_run_on_the_expected_NET_and_the_ASP_NET_Core_beside_it()
    {
        int expected = ExpectedMajor();
        var kestrel = typeof(KestrelServer).Assembly;
        string coreLibDirectory = Path.GetDirectoryName(typeof(object).Assembly.Location)!;
        string kestrelDirectory = Path.GetDirectoryName(kestrel.Location)!;

        // test.sh prints these lines from the results file, so the log of every run says what it ran on.
        output.WriteLine($"runtime: {RuntimeInformation.FrameworkDescription} (Environment.Version {Environment.Version}), host {Environment.ProcessPath}");
        output.WriteLine($"runtime: Microsoft.AspNetCore.Server.Kestrel.Core {kestrel.GetName().Version} " +
            $"({kestrel.GetCustomAttribute<AssemblyInformationalVersionAttribute>()?.InformationalVersion}) from {kestrelDirectory}");
        output.WriteLine($"runtime: expected .NET {expected} ({(Environment.GetEnvironmentVariable(ExpectVariable) is { Length: > 0 } v ? $"{ExpectVariable}={v}" : "the version built for")})");

        Assert.Equal(expected, Environment.Version.Major);
        Assert.StartsWith($".NET {expected}.", RuntimeInformation.FrameworkDescription, StringComparison.Ordinal);
        Assert.Equal(expected, kestrel.GetName().Version!.Major);
        Assert.Equal(Path.GetFullPath(Path.Combine(coreLibDirectory, "../../..")), Path.GetFullPath(Path.Combine(kestrelDirectory, "../../..")));

        // The sample, started as every endpoint test starts it, maps the very same runtime and Kestrel files as this process
        // (both read from /proc/PID/maps, so that both paths are the kernel's).
        var ours = MappedRuntimeFiles(Environment.ProcessId);
        await using var sample = await SampleProcess.StartAsync(["--urls", "http://127.0.0.1:0", "--transport", "linux", "--mode", "platform"]);
        var theirs = MappedRuntimeFiles(sample.Id);
        output.WriteLine($"runtime: the sample (pid {sample.Id}, started with {SampleLocation.DotnetHost}) maps {string.Join(", ", theirs)}");

        Assert.Equal(2, ours.Count);
        Assert.Equal(ours, theirs);
    }

    /// <summary>The files System.Private.CoreLib and Kestrel.Core are mapped from in process <paramref name="pid"/>, sorted.</summary>
    private static List<string> MappedRuntimeFiles(int pid) => File.ReadAllLines($"/proc/{pid}/maps")
        .Select(line => line.IndexOf('/', StringComparison.Ordinal) is var at and >= 0 ? line[at..] : "")
        .Where(path => path.EndsWith('/' + KestrelCore, StringComparison.Ordinal) || path.EndsWith('/' + CoreLib, StringComparison.Ordinal))
        .Distinct()
        .Order(StringComparer.Ordinal)
        .ToList();

    /// <summary>KTL_EXPECT_RUNTIME, else the major version of the target framework the suite is built for.</summary>
    private static int ExpectedMajor()
    {
        if (Environment.GetEnvironmentVariable(ExpectVariable) is { Length: > 0 } value)
        {
            return int.TryParse(value, out int major) && major > 0
                ? major
                : throw new InvalidOperationException($"{ExpectVariable}='{value}' is no major version (say 11).");
        }

        var framework = new FrameworkName(typeof(RuntimeUnderTestTests).Assembly.GetCustomAttribute<TargetFrameworkAttribute>()!.FrameworkName);
        return framework.Version.Major;
    }
}
