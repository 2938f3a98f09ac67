using System.Globalization;
using System.Text;

namespace TechEmpower.Platform;

/// <summary>
/// The platform responses' <c>Date</c> header line, rendered once a second by a timer instead of per
/// response. TechEmpower's verifier only requires that it changes within 3 seconds.
/// </summary>
public sealed class DateHeader : IDisposable
{
    private static readonly TimeSpan s_period = TimeSpan.FromSeconds(1);

    private readonly TimeProvider _time;
    private readonly ITimer _timer;
    private byte[] _line;

    /// <summary>Starts the timer.</summary>
    /// <param name="time">The clock; <see cref="TimeProvider.System"/> in the app.</param>
    public DateHeader(TimeProvider time)
    {
        ArgumentNullException.ThrowIfNull(time);
        _time = time;
        _line = Render(time.GetUtcNow());
        _timer = time.CreateTimer(static state => ((DateHeader)state!).Refresh(), this, s_period, s_period);
    }

    /// <summary>The whole header line, <c>Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n</c>, as of the last tick.</summary>
    public ReadOnlySpan<byte> Line => Volatile.Read(ref _line);

    /// <summary>Stops the timer.</summary>
    public void Dispose() => _timer.Dispose();

    private void Refresh() => Volatile.Write(ref _line, Render(_time.GetUtcNow()));

    // A new array per second rather than an update in place, so a reader never sees half a date.
    private static byte[] Render(DateTimeOffset now) =>
        Encoding.ASCII.GetBytes($"Date: {now.ToString("r", CultureInfo.InvariantCulture)}\r\n");
}
