namespace TechEmpower.Tests.Infrastructure;

/// <summary>Upper bounds for every wait, generous for a loaded 2-core machine; a passing run uses a fraction.</summary>
public static class TestTimeouts
{
    /// <summary>From starting the sample to its startup line (JIT, MVC start-up, binding).</summary>
    public static readonly TimeSpan Startup = TimeSpan.FromSeconds(60);

    /// <summary>One request, or one batch of pipelined requests.</summary>
    public static readonly TimeSpan Request = TimeSpan.FromSeconds(30);

    /// <summary>How long a killed sample may take to be reaped.</summary>
    public static readonly TimeSpan Exit = TimeSpan.FromSeconds(15);
}
