using System.Globalization;

namespace Kestrel.Transport.Linux.Connection;

/// <summary>
/// Connection ids: <c>L</c> and a 64-bit counter in 16 hex digits. The counter starts at the clock when the process
/// first needs it (UTC ticks: 100 ns since 0001-01-01), as the Sockets transport's does, so a restarted server or a
/// second replica does not repeat the ids of another in its logs and trace identifiers: one started a second later
/// begins 10^7 higher. The ids still sort in the order the connections asked for them.
/// </summary>
internal static class ConnectionIds
{
    private const int Length = 17;

    private static long s_last = DateTime.UtcNow.Ticks;

    public static string Next() => string.Create(Length, Interlocked.Increment(ref s_last), static (chars, id) =>
    {
        chars[0] = 'L';
        id.TryFormat(chars[1..], out _, "X16", CultureInfo.InvariantCulture);
    });
}
