namespace Kestrel.Transport.Linux.Microbenchmarks;

/// <summary>
/// Which parameter values the suites offer. The host process reads the <c>[ParamsSource]</c> members
/// once, before any benchmark runs, and passes the chosen values to each benchmark process, so setting
/// <see cref="Quick"/> in <c>Main</c> is enough.
/// </summary>
public static class SuiteScope
{
    /// <summary>True for <c>--quick</c>: the smallest subset that still runs every benchmark method.</summary>
    public static bool Quick { get; set; }

    /// <summary>
    /// False when libuv.so.1 did not load in the host process; the HTTP suite then offers no Libuv cases
    /// rather than fail each of them in its own process (<c>Main</c> says so on the console).
    /// </summary>
    public static bool LibuvAvailable { get; set; } = true;
}
