using System.Reflection;
using System.Runtime.InteropServices;
using System.Runtime.Versioning;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Server.Kestrel.Core;

namespace Kestrel.Transport.Linux.Tests.Runtime;

/// <summary>
/// Which .NET and which ASP.NET Core the suite runs on, said in its log and checked. The suite is built for net10.0; test.sh
/// also runs it on the .NET 11 runtime (tests/dotnet11), where a test host that quietly started on .NET 10 would pass every
/// test and prove nothing. KTL_EXPECT_RUNTIME names the major version the run must be on; unset, it is the one built for.
/// </summary>
public sealed class RuntimeUnderTestTests(ITestOutputHelper output)
{
    /// <summary>The major version the run must be on, when it is not the one the suite is built for.</summary>
    public const string ExpectVariable = "KTL_EXPECT_RUNTIME";

    [Fact]
    public void The_suite_runs_on_the_expected_NET_and_the_ASP_NET_Core_beside_it()
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
        output.WriteLine($"transports: {Transports.SelectionDescription}");

        Assert.Equal(expected, Environment.Version.Major);
        Assert.StartsWith($".NET {expected}.", RuntimeInformation.FrameworkDescription, StringComparison.Ordinal);
        Assert.Equal(expected, kestrel.GetName().Version!.Major);

        // Kestrel comes from the shared framework of the same installation as the runtime: <root>/shared/<framework>/<version>.
        Assert.Equal("Microsoft.AspNetCore.App", Path.GetFileName(Path.GetDirectoryName(kestrelDirectory)));
        Assert.Equal(Path.GetFullPath(Path.Combine(coreLibDirectory, "../../..")), Path.GetFullPath(Path.Combine(kestrelDirectory, "../../..")));
    }

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
