using System.Reflection;

namespace TechEmpower.Tests.Infrastructure;

/// <summary>Where the sample's build output is: recorded at build time from its project (see the .csproj).</summary>
public static class SampleLocation
{
    /// <summary>The full path of the sample's TechEmpower.dll, next to its runtimeconfig and native library.</summary>
    public static string Assembly { get; } = Find();

    /// <summary>
    /// The dotnet host to start it with: the one the SDK names for child processes, else the one on PATH.
    /// </summary>
    public static string DotnetHost { get; } = Environment.GetEnvironmentVariable("DOTNET_HOST_PATH") is { Length: > 0 } host
        && File.Exists(host) ? host : "dotnet";

    private static string Find()
    {
        var path = typeof(SampleLocation).Assembly.GetCustomAttributes<AssemblyMetadataAttribute>()
            .FirstOrDefault(a => a.Key == "TechEmpowerSampleAssembly")?.Value;
        if (string.IsNullOrEmpty(path) || !File.Exists(path))
        {
            throw new InvalidOperationException(
                $"The sample's build output was not found (recorded path: '{path}'). Build the solution first.");
        }

        return path;
    }
}
