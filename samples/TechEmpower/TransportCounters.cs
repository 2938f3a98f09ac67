using System.Collections.Concurrent;
using System.Diagnostics.Metrics;
using System.Globalization;

namespace TechEmpower;

/// <summary>
/// The final values of the Linux transport's counters (meter <c>Kestrel.Transport.Linux</c>), for the one line the
/// sample prints on exit: <c>TechEmpower: counters NAME=VALUE ...</c>, each summed over its tags, in name order.
/// The benchmarks read it, for example to count loop hand-offs per TLS handshake.
/// </summary>
/// <remarks>
/// Free on the hot path by choice of instruments. Observable counters (loop passes, bytes) are fields the transport
/// keeps anyway and are read once, at exit. Of the counters the transport records as things happen, only those
/// recorded per connection or rarer are listened to: accepted connections, accept errors, the engines' fallbacks and
/// every <c>kestrel.transport.linux.loop.*</c> counter (hand-offs, long passes, demotions); the zero-copy counters,
/// recorded per send, are left off. Up-down counters and histograms are not counters and are left off too.
/// </remarks>
public sealed class TransportCounters : IDisposable
{
    /// <summary>The transport's meter.</summary>
    public const string MeterName = "Kestrel.Transport.Linux";

    /// <summary>How the line begins.</summary>
    public const string LinePrefix = "TechEmpower: counters ";

    private const string Prefix = "kestrel.transport.linux.";

    private readonly MeterListener _listener = new();
    private readonly ConcurrentDictionary<string, Total> _totals = new(StringComparer.Ordinal);
    private readonly ConcurrentBag<Total> _observed = [];
    private int _recorded;

    /// <summary>Starts listening; start it before the host, so that it sees the transport's meter created.</summary>
    public TransportCounters()
    {
        _listener.InstrumentPublished = (instrument, listener) =>
        {
            if (instrument.Meter.Name != MeterName || Kind(instrument) is not { } observable)
            {
                return;
            }

            // Keyed by name: should two instruments share one (two transports in one host), their values add up.
            var total = _totals.GetOrAdd(instrument.Name, static _ => new Total());
            if (observable)
            {
                _observed.Add(total);
            }

            listener.EnableMeasurementEvents(instrument, total);
        };
        _listener.SetMeasurementEventCallback<long>((_, value, _, state) => Record(state, value));
        _listener.SetMeasurementEventCallback<int>((_, value, _, state) => Record(state, value));
        _listener.Start();
    }

    /// <summary>
    /// Reads the observable counters and composes the line; null when the meter recorded nothing (another transport).
    /// Call it once, after the host has stopped.
    /// </summary>
    /// <returns>The line, or null.</returns>
    public string? ReadLine()
    {
        // An observable counter reports its running total each time it is read: read each once, from zero.
        foreach (var total in _observed)
        {
            Interlocked.Exchange(ref total.Value, 0);
        }

        _listener.RecordObservableInstruments();
        if (Volatile.Read(ref _recorded) == 0 || _totals.IsEmpty)
        {
            return null;
        }

        var values = _totals
            .OrderBy(static t => t.Key, StringComparer.Ordinal)
            .Select(static t => string.Create(CultureInfo.InvariantCulture, $"{t.Key}={Volatile.Read(ref t.Value.Value)}"));
        return LinePrefix + string.Join(' ', values);
    }

    /// <inheritdoc />
    public void Dispose() => _listener.Dispose();

    // True for an observable counter, false for a counter cheap enough to listen to, null for an instrument to leave off.
    private static bool? Kind(Instrument instrument) => instrument switch
    {
        ObservableCounter<long> or ObservableCounter<int> => true,
        Counter<long> or Counter<int> when IsPerConnectionOrRarer(instrument.Name) => false,
        _ => null,
    };

    // Which counters the transport records per connection or more rarely (src/Transport.Linux/Diagnostics/TransportMetrics.cs).
    private static bool IsPerConnectionOrRarer(string name) =>
        name is Prefix + "connections.accepted" or Prefix + "accept.errors"
        || (name.StartsWith(Prefix, StringComparison.Ordinal) && name.EndsWith(".fallbacks", StringComparison.Ordinal))
        || name.StartsWith(Prefix + "loop.", StringComparison.Ordinal);

    private void Record(object? state, long value)
    {
        Interlocked.Add(ref ((Total)state!).Value, value);
        if (_recorded == 0)
        {
            Volatile.Write(ref _recorded, 1);
        }
    }

    private sealed class Total
    {
        public long Value;
    }
}
