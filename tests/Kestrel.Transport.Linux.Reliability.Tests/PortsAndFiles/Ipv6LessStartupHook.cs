using Kestrel.Transport.Linux.Reliability.Tests.PortsAndFiles;

#pragma warning disable CA1050 // The runtime finds a startup hook only as a type named StartupHook outside any namespace.

/// <summary>
/// Lets the IPv6-less host tests run their server in a child process started from this test assembly itself
/// (DOTNET_STARTUP_HOOKS pointing at it): without <see cref="Ipv6LessChild.Variable"/> it does nothing.
/// </summary>
internal static class StartupHook
#pragma warning restore CA1050
{
    public static void Initialize()
    {
        if (Environment.GetEnvironmentVariable(Ipv6LessChild.Variable) is { Length: > 0 } setting)
        {
            Environment.Exit(Ipv6LessChild.Run(setting));
        }
    }
}
