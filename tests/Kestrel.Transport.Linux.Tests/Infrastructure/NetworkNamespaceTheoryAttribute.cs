namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>A theory that is skipped, with the reason, where the test cannot have a network namespace of its own (<see cref="NetworkNamespace"/>).</summary>
public sealed class NetworkNamespaceTheoryAttribute : TheoryAttribute
{
    public NetworkNamespaceTheoryAttribute()
    {
        if (NetworkNamespace.UnavailableReason is { } reason)
        {
            Skip = reason;
        }
    }
}
