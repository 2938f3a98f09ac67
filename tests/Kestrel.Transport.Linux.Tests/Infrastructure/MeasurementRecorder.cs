using System.Collections.Concurrent;
using System.Diagnostics.Metrics;
using Kestrel.Transport.Linux.Diagnostics;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>Records every measurement of the instruments created by one meter factory (so parallel tests don't mix).</summary>
internal sealed class MeasurementRecorder : IDisposable
{
    private readonly MeterListener _listener = new();
    private readonly ConcurrentQueue<(string Name, double Value, string? Tag)> _measurements = new();

    public MeasurementRecorder(IMeterFactory scope)
    {
        _listener.InstrumentPublished = (instrument, listener) =>
        {
            if (instrument.Meter.Scope == scope && instrument.Meter.Name == TransportMetrics.MeterName)
            {
                listener.EnableMeasurementEvents(instrument);
            }
        };
        _listener.SetMeasurementEventCallback<long>((i, v, tags, _) => Record(i, v, tags));
        _listener.SetMeasurementEventCallback<int>((i, v, tags, _) => Record(i, v, tags));
        _listener.SetMeasurementEventCallback<double>((i, v, tags, _) => Record(i, v, tags));
        _listener.Start();
    }

    public void Collect() => _listener.RecordObservableInstruments();

    public long Sum(string name) => (long)_measurements.Where(m => m.Name == name).Sum(m => m.Value);

    /// <summary>
    /// The sum over measurements with <paramref name="tag"/>: a network.io.direction ("receive", "transmit"), or "key=value"
    /// for other tags ("kestrel.transport.linux.zerocopy.copied=true").
    /// </summary>
    public long Sum(string name, string tag)
        => (long)_measurements.Where(m => m.Name == name && m.Tag == tag).Sum(m => m.Value);

    public int Count(string name) => _measurements.Count(m => m.Name == name);

    /// <summary>The largest value recorded for <paramref name="name"/> (0 when none was).</summary>
    public double Max(string name) => _measurements.Where(m => m.Name == name).Select(m => m.Value).DefaultIfEmpty(0).Max();

    public long Last(string name, string? tag = null)
        => (long)_measurements.Where(m => m.Name == name && m.Tag == tag).Select(m => m.Value).LastOrDefault();

    public void Dispose() => _listener.Dispose();

    private void Record(Instrument instrument, double value, ReadOnlySpan<KeyValuePair<string, object?>> tags)
    {
        string? tagText = null;
        foreach (var tag in tags)
        {
            tagText = tag.Key == "network.io.direction"
                ? tag.Value as string
                : $"{tag.Key}={(tag.Value is bool b ? (b ? "true" : "false") : tag.Value)}";
        }

        _measurements.Enqueue((instrument.Name, value, tagText));
    }
}
