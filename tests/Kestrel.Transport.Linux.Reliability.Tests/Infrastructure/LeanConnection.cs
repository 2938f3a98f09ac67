using System.Net;

namespace Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;

/// <summary>
/// Raw HTTP connections for the load and fault tests, where thousands of connections must not cost much
/// memory each: one 1 KiB read buffer that never grows (a longer response head is an error, not a resize).
/// </summary>
internal static class LeanConnection
{
    public const int BufferSize = 1024;

    public static async Task<RawHttpConnection> ConnectAsync(EndPoint endPoint)
        => new(await TestSockets.ConnectAsync(endPoint), BufferSize, BufferSize);

    /// <summary>Reads one response; returns its status code and its body as text, for comparing both at once.</summary>
    public static async Task<(int Status, string Body)> ReadStatusAndBodyAsync(this RawHttpConnection connection, TimeSpan timeout)
    {
        var response = await connection.ReadResponseAsync(timeout);
        return (response.StatusCode, response.BodyText);
    }
}
